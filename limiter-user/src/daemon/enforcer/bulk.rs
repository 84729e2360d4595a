//! Changes of many runtime overrides at once: a bulk load, the overrides
//! whose time is up, and those a restarted daemon's policy cannot hold.

use std::collections::HashSet;

use ipnet::IpNet;

use super::{ApplyError, Decider, Enforcer, RuntimeEntry};
use crate::clock::unix_now;
use crate::{
    dataplane::PolicyMaps,
    policy::{OverrideAction, Policy},
};

impl Enforcer {
    /// Set `action` on every CIDR of `cidrs` as one new version, all or
    /// nothing: a bad entry is refused with its index and nothing changes.
    pub fn load(
        &mut self,
        maps: &mut impl PolicyMaps,
        cidrs: &[IpNet],
        action: OverrideAction,
        ttl: Option<u64>,
    ) -> Result<String, ApplyError> {
        let expires = ttl.map(|t| unix_now() + t);
        let mut changes = Vec::with_capacity(cidrs.len());
        let mut seen = HashSet::with_capacity(cidrs.len());
        for (index, &net) in cidrs.iter().enumerate() {
            let refuse = |message: String| ApplyError::Entry { index, message };
            if net.trunc() != net {
                return Err(refuse(format!("{net} has host bits set (did you mean {}?)", net.trunc())));
            }
            let bucket = if net.addr().is_ipv4() { self.base.v4_prefix } else { self.base.v6_prefix };
            if u32::from(net.prefix_len()) > bucket {
                return Err(refuse(format!("{net} is longer than the bucket prefix /{bucket}")));
            }
            if !seen.insert(net) {
                return Err(refuse(format!("{net} is listed twice")));
            }
            changes.push((
                (net, Decider::Operator),
                Some(RuntimeEntry { action: Some(action), expires, by: Decider::Operator }),
            ));
        }
        self.change_entries(maps, &changes)
    }

    /// Forget the runtime overrides whose time is up at `now` (Unix
    /// seconds), as one new version; `None` when none is.
    pub fn expire(&mut self, maps: &mut impl PolicyMaps, now: u64) -> Option<Result<String, ApplyError>> {
        self.layers.governor.expire_shadow(now);
        let lifted = self.expire_escalations(maps, now);
        if let Some(Err(e)) = lifted {
            return Some(Err(e));
        }
        let due: Vec<((IpNet, Decider), Option<RuntimeEntry>)> = self
            .layers
            .entries
            .iter()
            .filter(|(_, e)| e.expires.is_some_and(|t| t <= now))
            .map(|(k, _)| (*k, None))
            .collect();
        for ((net, by), _) in &due {
            if by.governed() {
                self.layers.governor.reasons.remove(net);
            }
        }
        if due.is_empty() {
            return lifted;
        }
        Some(self.change_entries(maps, &due))
    }

    /// The earliest end of a runtime override, a shadow decision, an
    /// escalation or a deny-set decision, if any.
    #[must_use]
    pub fn next_expiry(&self) -> Option<u64> {
        [self.layers.next_end(), self.deny.next_end()].into_iter().flatten().min()
    }

    /// Set aside restored runtime overrides that `base` cannot hold (see
    /// [`super::Layers::drop_unfit`]).
    pub fn drop_unfit(&mut self, base: &Policy) -> Vec<String> {
        self.layers.drop_unfit(base)
    }
}
