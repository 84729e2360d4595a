//! The words every section of the policy says a decision with, below the
//! model so each feature's section (`crate::groups::section`) uses them
//! without the model: what a decision does ([`Action`]), and the names a
//! source may take ([`valid_name`]).

use serde::{Deserialize, Serialize};

/// What a decision does to the networks it covers: the one word every
/// section, request and listing says it with, each taking the ones it
/// allows ([`Action::only`]): an override's `action` is `allow` or
/// `deny` (a limit is its rate and burst), `prefix load`'s the same, a
/// feed's `deny`, a group's `rate`, `allow` or `deny`; `prefix list`
/// shows `limit`, `allow`, `deny` or `unset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Own limits for each bucket it covers.
    Limit,
    /// One budget for all it covers together (a group's).
    Rate,
    /// Never limited.
    Allow,
    /// Always dropped.
    Deny,
    /// The file's override, removed by the operator.
    Unset,
}

impl Action {
    /// Its word.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Limit => "limit",
            Action::Rate => "rate",
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Unset => "unset",
        }
    }

    /// Itself if it is one of `allowed`, else what to say: `allowed`'s
    /// words.
    pub fn only(self, allowed: &[Action]) -> Result<Self, String> {
        if allowed.contains(&self) {
            return Ok(self);
        }
        let words: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
        Err(format!("\"{self}\" is not one of {}", words.join(", ")))
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Whether `name` may name a feed or a group (its metrics label, its
/// origin): 1 to 40 letters, digits, `_`, `-` or `.`.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    !name.is_empty() && name.len() <= 40 && name.chars().all(ok)
}
