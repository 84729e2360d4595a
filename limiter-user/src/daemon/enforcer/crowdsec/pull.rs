//! A pull's edges: its first part (a startup pull starts the decisions
//! over, what they denied set aside), its last (what a startup pull no
//! longer names lifted, and its line), and the pins' CrowdSec networks
//! at a restart.

use super::{Decisions, Tally};
use crate::{daemon::enforcer::Enforcer, dataplane::deny::Origin, policy::crowdsec::Crowdsec};

impl Enforcer {
    /// The line of a pull, when its last part is applied.
    pub(super) fn pull_line(&self, startup: bool, shadow: bool, unreadable: Option<(usize, usize)>) -> String {
        let t = self.crowdsec.tally;
        format!(
            "crowdsec: {} pull: {} new, {} deleted{}; {} networks denied, {} lifted, {} left out; {} in force{}",
            if startup { "startup" } else { "delta" },
            t.new,
            t.deleted,
            unreadable.map_or_else(String::new, |(value, duration)| format!(
                ", {value} with an unreadable value, {duration} with an unreadable or sub-second duration"
            )),
            t.added,
            t.lifted,
            t.left_out,
            self.crowdsec.len(),
            if shadow { format!(" (shadow: {} counted, not enforced)", self.crowdsec.shadow) } else { String::new() }
        )
    }

    /// The first part of a pull: its tally starts; a startup pull starts
    /// the decisions over (what they denied set aside, to be lifted at
    /// its end unless it names them again) with room for all of it.
    pub(super) fn begin_pull(&mut self, spec: &Crowdsec, startup: bool, of: usize) {
        self.crowdsec.tally = Tally::default();
        if !startup {
            return;
        }
        let old = std::mem::take(&mut self.crowdsec);
        let mut stale = old.stale;
        if stale.is_empty() {
            stale = old.by_net;
        } else {
            stale.extend(old.by_net);
        }
        self.crowdsec = Decisions { left_out: old.left_out, stale, ..Decisions::default() };
        // A map growing by doubling rehashes it all within one part; a
        // delta's new networks are few.
        let room = of.min(spec.max_decisions);
        self.crowdsec.by_net.reserve(room);
        self.deny.set.reserve(room);
    }

    /// The end of a startup pull: lift every network denied for CrowdSec
    /// before it that none of its decisions named. Returns how many.
    pub(super) fn sweep_crowdsec(&mut self) -> usize {
        let mut lifted = 0;
        for (net, origin) in std::mem::take(&mut self.crowdsec.stale).into_keys() {
            if !self.crowdsec.by_net.contains_key(&(net, origin)) {
                self.deny.set.remove(origin, &net);
                lifted += 1;
            }
        }
        lifted
    }

    /// At a restart: the networks the pins hold for CrowdSec, lifted by the
    /// first startup pull unless it names them (decisions deleted while
    /// no daemon ran).
    pub(in crate::daemon::enforcer) fn note_pinned_crowdsec(&mut self) {
        let origins: Vec<Origin> =
            self.deny.origins().filter(|(_, n)| n.starts_with("crowdsec:")).map(|(i, _)| Origin(i)).collect();
        for origin in origins {
            self.crowdsec.stale.extend(self.deny.set.of(origin).map(|n| ((n, origin), Vec::new())));
        }
    }
}
