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
