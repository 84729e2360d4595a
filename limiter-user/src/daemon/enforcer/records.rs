//! The pinned `RUNTIME` record of the overrides set at run time: each
//! written before it is applied, and read back by a restarted daemon
//! (escalations, which the deny set holds, go there).

use ipnet::IpNet;
use limiter_common::maps::RUNTIME;

use super::{Enforcer, RuntimeEntry};
use crate::{
    dataplane::{LoadError, PolicyMaps},
    policy::runtime::{self, Decider},
};

impl Enforcer {
    /// Set (`Some`) or forget (`None`) the runtime entry of a network's
    /// layer, in the `RUNTIME` map and then in memory.
    pub(super) fn record(
        &mut self,
        maps: &mut impl PolicyMaps,
        at: (IpNet, Decider),
        entry: Option<RuntimeEntry>,
    ) -> Result<(), LoadError> {
        let value = entry.map(|e| {
            let expires = e.expires.map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX));
            runtime::value(e.action.as_ref(), expires, at.1)
        });
        maps.set_runtime_override(&runtime::key(&at.0, at.1), value.as_ref())?;
        match entry {
            Some(e) => self.layers.entries.insert(at, e),
            None => self.layers.entries.remove(&at),
        };
        Ok(())
    }

    /// Put back the overrides a previous daemon set at run time (kept in
    /// the pinned `RUNTIME` map). Returns how many; entries this build
    /// cannot read are skipped with a warning.
    pub fn restore(&mut self, maps: &mut impl PolicyMaps) -> Result<usize, LoadError> {
        let mut escalations = Vec::new();
        for (k, v) in maps.runtime_overrides()? {
            if let Some((net, action, expires, origin)) = runtime::decode(&k, &v) {
                let expires = (expires != 0).then_some(u64::from(expires));
                // A record of a build before layers: moved under its
                // layer's key, so that its removal finds it.
                let stale = runtime::stale_key(&k, origin);
                if stale {
                    maps.set_runtime_override(&k, None)?;
                }
                // Escalations are the deny set's (a build before it kept
                // them as overrides of whole buckets: those move too). One
                // without an end never came from escalation: it ends now.
                if origin == Decider::Escalation {
                    let end = expires.unwrap_or(0);
                    if stale {
                        super::escalation::set_record(maps, &net, Some(end))?;
                    }
                    escalations.push((net, end));
                    continue;
                }
                let entry = RuntimeEntry { action, expires, by: origin };
                if stale {
                    self.record(maps, (net, origin), Some(entry))?;
                }
                self.layers.entries.insert((net, origin), entry);
            } else {
                tracing::warn!("limiter: skipped an unreadable entry of {RUNTIME}: {k:?}");
            }
        }
        self.deny.read_back(maps)?;
        let n = escalations.len();
        self.restore_escalations(maps, escalations)?;
        Ok(self.layers.entries.len() + n)
    }
}
