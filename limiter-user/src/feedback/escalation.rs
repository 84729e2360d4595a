//! The daemon's own decider, escalation, as a feature: it hears every
//! sampled drop (rate-limited drops from their sources; verified SYN
//! cookies, which prove an address), judges once a second which proven
//! sources dropped above `feedback.escalate`'s rate long enough, and
//! decides through the sink like every other decider: each finding is a
//! penalty (`Change::Penalty`, by [`Origin::Escalation`]) the governor
//! judges as it judges the tenant's. Its series are its own
//! (`limiter_escalations_*`, `limiter_proven_sources`).

use std::collections::VecDeque;

use limiter_common::Reason;

use super::{EscalationCounts, escalate::Escalator};
use crate::engine::{
    changes::Change,
    decision::{Decision, Sink},
    feature::{Applied, Feature, InForce, Sample, Second},
};
use crate::{
    origin::Origin,
    policy::feedback::{Escalate, Refusal},
    series::Series,
};

/// Penalties decided and not yet taken by the sink (it was full), sent
/// first at the next second; beyond this many the oldest are let go (the
/// escalator asks again for a source still dropping once its deny would
/// have ended).
const MAX_WAITING: usize = 64;

/// The feature.
pub(crate) struct Escalation {
    escalator: Escalator,
    /// The rule in force (`feedback.escalate`), if any.
    rule: Option<Escalate>,
    sink: Sink,
    /// Decided, not yet sent.
    waiting: VecDeque<Change>,
    /// Penalties sent down the path.
    asked: u64,
    /// Of them, refused by the governor at `feedback.escalate.max_denied`.
    refused_at_cap: u64,
}

impl Escalation {
    pub(crate) fn new(sink: Sink) -> Self {
        Self {
            escalator: Escalator::with_sockets(),
            rule: None,
            sink,
            waiting: VecDeque::new(),
            asked: 0,
            refused_at_cap: 0,
        }
    }

    /// The addresses the escalator found this second, as penalties
    /// (`held`: their drops were of connections this host holds).
    fn decide(&mut self) {
        let found = self.escalator.second(self.rule.as_ref(), crate::clock::unix_now());
        let Some(rule) = self.rule else { return };
        let secs = rule.sustained.as_secs();
        for f in found {
            let (net, rate) = (f.net, f.rate);
            let bound = if f.bound { ", of connections this host holds" } else { "" };
            tracing::info!(event = "escalation", cidr = %net, rate, bound = f.bound, "limiter: {net} dropped at about {rate}/s for {secs} s{bound}: asking to deny it");
            if self.waiting.len() >= MAX_WAITING {
                self.waiting.pop_front();
            }
            self.waiting.push_back(Change::Penalty {
                net: Ok(net),
                ttl: rule.deny_for.as_secs(),
                reason: format!("escalation: about {rate} drops/s for {secs} s{bound}"),
                by: Origin::Escalation,
                held: f.bound,
            });
        }
    }

    /// Send what waits, while the sink takes it.
    fn send(&mut self) {
        while let Some(change) = self.waiting.pop_front() {
            match self.sink.try_send(Decision::Told(change)) {
                Ok(()) => self.asked += 1,
                Err(e) => {
                    if let Decision::Told(change) = e.into_inner() {
                        self.waiting.push_front(change);
                    }
                    return;
                }
            }
        }
    }
}

impl Feature for Escalation {
    fn apply(&mut self, a: &InForce<'_>) {
        self.rule = a.policy.feedback.as_ref().and_then(|f| f.escalate);
    }

    /// A rate-limited drop is evidence, a verified SYN cookie a proof of
    /// its source.
    fn sampled(&mut self, s: &Sample) {
        if s.reason == Reason::SynCookieVerified as u32 {
            if let Some(a) = s.src {
                self.escalator.proven.prove(a, s.at);
            }
        } else if s.reason == Reason::RateLimited as u32 {
            self.escalator.record(s.key, s.src, s.held);
        }
    }

    fn tick(&mut self, _second: &Second<'_>) {
        self.decide();
        self.send();
    }

    /// The governor refused one of its penalties at its cap.
    fn applied(&mut self, a: &mut Applied<'_>) {
        if let Change::Penalty { by: Origin::Escalation, .. } = a.change
            && a.refusal == Some(Refusal::Cap)
        {
            self.refused_at_cap += 1;
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        let e = &self.escalator;
        Some(Box::new(EscalationCounts {
            escalations: self.asked,
            unproven: e.unproven,
            proven_sources: e.proven.len() as u64,
            capped: self.refused_at_cap + e.capped,
        }))
    }
}
