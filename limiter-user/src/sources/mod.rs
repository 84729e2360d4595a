//! File-backed sources of decisions: a `[[source]]` section names a file
//! of networks the operator keeps (an allow list, ...) and the kind of
//! file it is; the daemon watches the file (`crate::watch`), reads it
//! with its kind, checks what it read (width, count, shrink) and puts its
//! networks in the policy state as a layer of overrides just below the
//! policy file's own (`layer`): an operator's override or the file's of
//! the same network wins, automation never replaces a source's `allow`.
//!
//! What every kind shares is here: the section (`section`), the checks
//! and the watching (`feature`), the layer (`layer`). A kind is only its
//! reader: its own folder below this one, registered by one line in
//! [`kinds!`], the one place that names the kinds.

pub mod feature;
pub mod layer;
pub mod section;

use std::collections::BTreeSet;

use ipnet::IpNet;

use crate::policy::words::Action;

/// One kind of source file: how it is read and what its networks may be
/// given.
#[derive(Debug)]
pub struct Kind {
    /// What `kind = "..."` says.
    pub name: &'static str,
    /// The actions a section of this kind may take, the first its default.
    pub actions: &'static [Action],
    /// Read the file's text into its networks, or say which line is not
    /// one (the whole version is then refused; the last one stays).
    pub read: fn(&str) -> Result<BTreeSet<IpNet>, Refused>,
}

/// Why a file's text is not a version of its source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}")]
pub struct Refused {
    /// 1-based; 0 for the file as a whole.
    pub line: usize,
    pub why: String,
}

/// Most networks one source may hold (each is an override of the data
/// plane, whose tries hold `limiter_common::maps::MAX_OVERRIDES`).
pub const MAX_NETWORKS: usize = 100_000;

/// Longest line a kind reads.
pub const MAX_LINE: usize = 1024;

/// The networks of a file of at most one network per line: `#` starts a
/// comment, blank lines are skipped, and `line` reads what is left of
/// each (its network, `None` for a line that holds none, or why it is
/// not one). Lines are bounded ([`MAX_LINE`]) and so are the networks
/// (`max`).
pub fn per_line(
    text: &str,
    max: usize,
    mut line: impl FnMut(&str) -> Result<Option<IpNet>, String>,
) -> Result<BTreeSet<IpNet>, Refused> {
    let mut nets = BTreeSet::new();
    for (i, l) in text.lines().enumerate() {
        let refused = |why: String| Refused { line: i + 1, why };
        if l.len() > MAX_LINE {
            return Err(refused(format!("longer than {MAX_LINE} bytes")));
        }
        let l = l.split('#').next().unwrap_or_default().trim();
        if l.is_empty() {
            continue;
        }
        if let Some(net) = line(l).map_err(|why| refused(crate::escape_control(&why)))? {
            nets.insert(net);
        }
        if nets.len() > max {
            return Err(refused(format!("more than {max} networks")));
        }
    }
    Ok(nets)
}

/// Declare each kind's folder and list it in [`KINDS`].
macro_rules! kinds {
    ($($kind:ident),* $(,)?) => {
        $(pub mod $kind;)*
        /// Every kind, by the name a section gives it.
        pub const KINDS: &[&Kind] = &[$(&$kind::KIND),*];
    };
}

kinds! { plain, ipset }

/// The kind called `name`.
#[must_use]
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().copied().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<BTreeSet<IpNet>, Refused> {
        per_line(text, 3, |l| l.parse::<IpNet>().map(Some).map_err(|e| format!("{l:?}: {e}")))
    }

    /// The layer gives a source's networks `allow` or `deny` only, and a
    /// section names its kind by one name.
    #[test]
    fn every_kind_takes_allow_or_deny_and_has_a_name_of_its_own() {
        for (i, k) in KINDS.iter().enumerate() {
            assert!(
                !k.actions.is_empty() && k.actions.iter().all(|a| matches!(a, Action::Allow | Action::Deny)),
                "{k:?}"
            );
            assert!(KINDS[..i].iter().all(|o| o.name != k.name), "{} twice", k.name);
            assert!(crate::policy::words::valid_name(k.name));
        }
    }

    #[test]
    fn lines_are_read_with_comments_and_blanks_skipped() {
        let nets = read("# office\n198.18.0.0/24  # hq\n\n2001:2::/48\n198.18.0.0/24\n").unwrap();
        let want: BTreeSet<IpNet> = ["198.18.0.0/24", "2001:2::/48"].iter().map(|n| n.parse().unwrap()).collect();
        assert_eq!(nets, want);
    }

    #[test]
    fn a_bad_line_a_long_line_or_too_many_refuse_the_version_with_the_line() {
        let e = read("198.18.0.0/24\nnot a net\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.why.contains("not a net"), "{e}");
        assert_eq!(read(&"x".repeat(MAX_LINE + 1)).unwrap_err().line, 1);
        let e = read("198.18.0.0/24\n198.18.1.0/24\n198.18.2.0/24\n198.18.3.0/24\n").unwrap_err();
        assert_eq!((e.line, e.why.as_str()), (4, "more than 3 networks"));
        assert!(read("\u{1b}[31m\n").unwrap_err().why.contains("\\u{1b}"), "a control character reached the log");
    }
}
