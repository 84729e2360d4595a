//! What the daemon checks every second besides its counters: that its
//! program is still on its interface (and pinned), which runtime
//! overrides have expired, and which addresses escalation would deny.

use super::{Daemon, changes::Change};
use crate::{dataplane::Health, policy::runtime::Decider};

impl Daemon {
    /// Once a second: start forgetting runtime overrides whose time is up
    /// (when no other change runs; it is one change for all of them).
    pub(super) fn expire_overrides(&mut self) {
        if self.expiry_due() && self.changes.running.is_none() {
            self.change(Change::Expire, None);
        }
    }

    /// Whether an override, escalation or decision has reached its end.
    pub(super) fn expiry_due(&self) -> bool {
        self.policy.as_ref().and_then(|(p, _)| p.next_expiry()).is_some_and(|t| t <= crate::clock::unix_now())
    }

    /// Once a second: ask to deny the addresses escalation found (through
    /// the governor, like a penalty from the tenant layer).
    pub(super) fn escalate(&mut self) {
        let rule = self.view.escalate;
        for (net, rate) in self.observer.escalator.second(rule.as_ref(), crate::clock::unix_now()) {
            let Some(rule) = rule else { break };
            let cidr = net.to_string();
            let reason = format!("escalation: about {rate} drops/s for {} s", rule.sustained.as_secs());
            tracing::info!(event = "escalation", cidr = %cidr, rate, "limiter: {cidr} dropped at about {rate}/s for {} s: asking to deny it", rule.sustained.as_secs());
            let ttl = rule.deny_for.as_secs();
            self.change(Change::Penalty { cidr, ttl, reason, by: Decider::Escalation }, None);
        }
    }

    /// Once a second: is the program still on its interface (and pinned)?
    /// If not, say so (metrics and status too) and put it back.
    pub(super) fn check_attachment(&mut self) {
        let health = self.link.attachment.health();
        if let Health::Detached(why) = &health {
            if self.link.health == Health::Attached {
                tracing::error!(event = "detached", iface = %self.settings.iface, "limiter: NOT ENFORCING: {why}");
            }
            match self.dp.repair(&mut self.link.attachment) {
                Ok(done) => {
                    self.link.repairs += 1;
                    tracing::warn!(event = "reattached", iface = %self.settings.iface, "limiter: {done}");
                    self.link.health = self.link.attachment.health();
                    return;
                }
                Err(e) if self.link.health == Health::Attached => {
                    let e = anyhow::Error::from(e);
                    tracing::error!("limiter: cannot attach again yet (retrying every second): {e:#}");
                }
                Err(_) => {}
            }
        }
        self.link.health = health;
    }
}
