//! The overrides in force as `prefix list` answers them: each network,
//! what is decided for it and by whom, and the layers beneath.

use serde::{Deserialize, Serialize};

/// A unit enum of the protocol whose wire form (and display, and what it
/// compares equal to) is its label.
macro_rules! labels {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $v:ident = $l:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $l)] $v),+
        }

        impl $name {
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => $l),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

labels! {
    /// What an override does, as `prefix list` shows it.
    EntryAction {
        Limit = "limit",
        Allow = "allow",
        Deny = "deny",
        /// The operator removed the file's override.
        Unset = "unset",
    }
}

labels! {
    /// Who decided an override: the operator at run time, the policy file,
    /// or automation (the tenant layer's feedback, the daemon's
    /// escalation; in feedback's shadow mode, listed and not enforced).
    Origin {
        Runtime = "runtime",
        File = "file",
        Feedback = "feedback",
        Escalation = "escalation",
        FeedbackShadow = "feedback (shadow)",
        EscalationShadow = "escalation (shadow)",
        /// A CrowdSec decision in the deny set (`source` names its origin).
        Crowdsec = "crowdsec",
    }
}

impl Origin {
    /// Decided by the tenant layer's feedback or the daemon's escalation
    /// (the penalties the tenant layer may list).
    #[must_use]
    pub fn is_automation(self) -> bool {
        !matches!(self, Origin::Runtime | Origin::File | Origin::Crowdsec)
    }
}

/// The overrides in force, and the deny set's CrowdSec decisions (the
/// first [`MAX_LISTED_DECISIONS`] by network; `more` counts the rest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixList {
    pub version: u64,
    pub entries: Vec<PrefixEntry>,
    /// CrowdSec decisions in force beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
}

/// CrowdSec decisions one `prefix list` answer holds at most.
pub const MAX_LISTED_DECISIONS: usize = 10_000;

#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if signature")]
fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixEntry {
    pub cidr: ipnet::IpNet,
    pub action: EntryAction,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    pub origin: Origin,
    /// Seconds until a runtime override expires (`None`: never).
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
    /// Why the tenant layer asked for it (feedback only).
    #[serde(default)]
    pub reason: Option<String>,
    /// The deny set's origin that decided it (`crowdsec:cscli`,
    /// `crowdsec:lists:NAME`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Every layer that decided something about this network, highest
    /// first, when more than one did (the fields above are the one in
    /// force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerEntry>,
}

/// One layer's decision about a network: the operator's (`runtime`), the
/// policy file's (`file`), or automation's (`feedback`, `escalation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    pub layer: Origin,
    pub action: EntryAction,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    /// Seconds until it expires (`None`: never).
    pub expires_in_secs: Option<u64>,
    /// Whether this layer is the one enforced.
    pub in_force: bool,
}
