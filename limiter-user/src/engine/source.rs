//! How a source of decisions (a feed, CrowdSec, a country or ASN
//! group) hands the policy state its changes: the feature is given a
//! [`Sink`](super::decision::Sink) at start and sends each change as a
//! [`SourceChange`] (in a [`Decision::Source`](super::decision::Decision));
//! the daemon's loop takes every decision in one arm, whatever its
//! source, and runs it off the loop like any change, after the operator's
//! that wait (see `changes.rs`). What a change does is the source's own code; the
//! daemon only orders, splits, drops stale parts and reports.

use super::{ApplyError, Enforcer};
use crate::{dataplane::maps::Tables, origin::Named};

/// A change of the policy state made by a source of decisions.
pub(crate) trait SourceChange: Send + std::fmt::Debug {
    /// Who makes it (`feed:NAME`, `group:NAME`, `crowdsec:lapi`): the
    /// feature that sent it knows its outcome by it (`Feature::applied`),
    /// and a newer version of the same replaces it in the queue.
    fn origin(&self) -> Named;

    /// Carry it out, on the thread that holds the policy state.
    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError>;

    /// The change in parts, each applied when nothing else runs or waits
    /// (a pull of 850,000 decisions in parts of 2,000: the operator's
    /// change waits for one part at most).
    fn parts(self: Box<Self>) -> Vec<Box<dyn SourceChange>>;

    /// Still wanted: a part of a section no longer in force is dropped.
    fn current(&self) -> bool {
        true
    }

    /// Whether it is a newer version of `waiting` (the same feed), which
    /// it then replaces in the queue.
    fn replaces(&self, _waiting: &dyn SourceChange) -> bool {
        false
    }

    /// Whether it leaves much heap free (a whole version, a pull's last
    /// part): the daemon gives it back to the system after it.
    fn frees_heap(&self) -> bool {
        true
    }

    /// Say how it went (a log line; nothing for a part that has none).
    fn report(&self, result: &Result<String, ApplyError>);
}

/// What a whole version of a watched file does with the policy state (a
/// feed's networks diffed into the deny set, a group's into its tries):
/// the source's own code, wrapped in a [`Version`].
pub(crate) trait VersionOf: Send + std::fmt::Debug + 'static {
    /// Carry it out, on the thread that holds the policy state.
    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError>;

    /// Say how it went (one log line).
    fn report(&self, result: &Result<String, ApplyError>);
}

/// A whole version of a watched file, as a change: one part, dropped if
/// the section it was read under went (removed or changed while it
/// waited: a removed source's networks never come back), and replacing a
/// version of the same origin still waiting.
#[derive(Debug)]
pub(crate) struct Version<T> {
    /// `feed:NAME`, `group:NAME`.
    pub(crate) origin: Named,
    /// The section it was read under (`crate::watch::Watch::section`).
    pub(crate) section: std::sync::Weak<()>,
    pub(crate) body: T,
}

impl<T: VersionOf> SourceChange for Version<T> {
    fn origin(&self) -> Named {
        self.origin.clone()
    }

    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        self.body.run(state, tables)
    }

    fn parts(self: Box<Self>) -> Vec<Box<dyn SourceChange>> {
        vec![self]
    }

    /// Its section still stands as it was read under.
    fn current(&self) -> bool {
        self.section.strong_count() > 0
    }

    /// A newer version of the same source.
    fn replaces(&self, waiting: &dyn SourceChange) -> bool {
        waiting.origin() == self.origin
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        self.body.report(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nothing;

    impl VersionOf for Nothing {
        fn run(&mut self, _: &mut Enforcer, _: &mut Tables) -> Result<String, ApplyError> {
            Ok(String::new())
        }

        fn report(&self, _: &Result<String, ApplyError>) {}
    }

    #[test]
    fn a_version_waiting_when_its_section_goes_is_dropped_and_a_newer_replaces_it() {
        let section = std::sync::Arc::new(());
        let of = |name: &str| Version {
            origin: Named::feed(name),
            section: std::sync::Arc::downgrade(&section),
            body: Nothing,
        };
        let (v, newer, other) = (of("x"), of("x"), of("y"));
        assert!(v.current());
        assert!(newer.replaces(&v) && !other.replaces(&v));
        drop(section);
        assert!(!v.current(), "a version of a removed or changed section would be applied");
    }
}
