//! Escalations in force: the daemon's own denies of proven addresses
//! (`feedback::escalate`). A /32 or a /128 lies inside a bucket, which an
//! override cannot tell apart, so they are networks of the deny set under
//! the origin `escalation` (beneath every allow and deny of the operator
//! and the file, like feeds). Each is recorded in the pinned `RUNTIME`
//! map with its end before it is written, so a restarted daemon keeps it
//! to the second; it is lifted when it ends or when the operator unsets
//! it, and never outlives its TTL.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::{ApplyError, deny::DenyLayer};
use crate::clock::unix_now;
use crate::{
    control::{PrefixEntry, Shown},
    dataplane::{LoadError, PolicyMaps},
    origin::Origin,
    policy::{Action, OverrideAction, runtime},
};

/// The deny set's origin of escalations.
pub const ORIGIN: &str = Origin::Escalation.label();

/// What escalation denies now: each network with its Unix end and why.
#[derive(Debug, Default)]
pub struct Escalations {
    pub(super) nets: BTreeMap<IpNet, (u64, String)>,
}

impl Escalations {
    /// Whether it denies none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub(super) fn next_end(&self) -> Option<u64> {
        self.nets.values().map(|(t, _)| *t).min()
    }

    /// How `prefix list` and `GET /v1/penalties` show them.
    pub(super) fn entries(&self) -> impl Iterator<Item = PrefixEntry> + '_ {
        let now = unix_now();
        self.nets.iter().map(move |(net, (end, why))| PrefixEntry {
            cidr: *net,
            action: Action::Deny,
            rate: None,
            burst: None,
            origin: Shown::of(Origin::Escalation),
            expires_in_secs: Some(end.saturating_sub(now)),
            reason: Some(why.clone()),
            layers: Vec::new(),
            source: None,
        })
    }
}

/// Write (`Some(end)`) or remove (`None`) the `RUNTIME` record of the
/// escalation of `net`.
pub(super) fn set_record(maps: &mut impl PolicyMaps, net: &IpNet, end: Option<u64>) -> Result<(), LoadError> {
    let value = end
        .map(|t| runtime::value(Some(&OverrideAction::Deny), u32::try_from(t).unwrap_or(u32::MAX), Origin::Escalation));
    maps.set_runtime_override(&runtime::key(net, Origin::Escalation), value.as_ref())
}

impl Escalations {
    /// Deny `net` until `end` (an escalation the governor allowed) in
    /// `deny`: the record first, then the deny set; on any failure
    /// neither stays.
    pub(super) fn deny(
        &mut self,
        deny: &mut DenyLayer,
        maps: &mut impl PolicyMaps,
        net: IpNet,
        end: u64,
        reason: &str,
    ) -> Result<String, ApplyError> {
        let was = self.nets.get(&net).map(|(t, _)| *t);
        set_record(maps, &net, Some(end))?;
        let added = deny.set.origin(ORIGIN).and_then(|o| deny.set.add(o, &net));
        let written = match added {
            Ok(()) => deny.write(maps).map_err(ApplyError::from),
            Err(e) => {
                let _ = deny.set.finish();
                Err(ApplyError::Request(format!("escalation of {net}: {e}")))
            }
        };
        if let Err(e) = written {
            // The record as it was (none, or the escalation refreshed).
            let _ = set_record(maps, &net, was);
            return Err(e);
        }
        self.nets.insert(net, (end, reason.to_owned()));
        Ok(format!("escalation: {net} denied for {} s (in the deny set)", end.saturating_sub(unix_now())))
    }

    /// Lift the escalations of `nets` (ended, or unset by the operator):
    /// out of the deny set, then their records.
    fn lift(&mut self, deny: &mut DenyLayer, maps: &mut impl PolicyMaps, nets: &[IpNet]) -> Result<(), ApplyError> {
        if let Some(o) = deny.set.named(ORIGIN) {
            for n in nets {
                deny.set.remove(o, n);
            }
        }
        deny.write(maps)?;
        for n in nets {
            if let Err(e) = set_record(maps, n, None) {
                tracing::warn!("limiter: the record of escalation {n} stays in RUNTIME: {e}");
            }
            self.nets.remove(n);
        }
        Ok(())
    }

    /// The operator unsets `net`: its escalation is lifted, if it has one.
    pub(super) fn unset(
        &mut self,
        deny: &mut DenyLayer,
        maps: &mut impl PolicyMaps,
        net: IpNet,
    ) -> Option<Result<String, ApplyError>> {
        self.nets
            .contains_key(&net)
            .then(|| self.lift(deny, maps, &[net]).map(|()| format!("escalation of {net} lifted by the operator")))
    }

    /// Lift the escalations whose time is up at `now`.
    pub(super) fn expire(
        &mut self,
        deny: &mut DenyLayer,
        maps: &mut impl PolicyMaps,
        now: u64,
    ) -> Option<Result<String, ApplyError>> {
        let due: Vec<IpNet> = self.nets.iter().filter(|(_, (t, _))| *t <= now).map(|(n, _)| *n).collect();
        (!due.is_empty()).then(|| self.lift(deny, maps, &due).map(|()| format!("{} escalation(s) ended", due.len())))
    }

    /// A restart: the escalations recorded in `RUNTIME` (`restored`, with
    /// their ends) are what the deny set's `escalation` origin holds;
    /// whatever the pins hold beyond them goes (a record removed before a
    /// crash cut the lift short), whatever they miss is written.
    pub(super) fn restore(
        &mut self,
        deny: &mut DenyLayer,
        maps: &mut impl PolicyMaps,
        restored: Vec<(IpNet, u64)>,
    ) -> Result<(), LoadError> {
        let pinned: Vec<IpNet> = deny.set.named(ORIGIN).map(|o| deny.set.of(o).collect()).unwrap_or_default();
        if restored.is_empty() && pinned.is_empty() {
            return Ok(());
        }
        let origin = match deny.set.origin(ORIGIN) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("limiter: escalations not restored: {e}");
                return Ok(());
            }
        };
        let recorded: std::collections::HashSet<IpNet> = restored.iter().map(|(n, _)| *n).collect();
        for n in pinned.iter().filter(|n| !recorded.contains(n)) {
            deny.set.remove(origin, n);
        }
        for (net, end) in restored {
            if let Err(e) = deny.set.add(origin, &net) {
                tracing::warn!("limiter: escalation of {net} not restored: {e}");
                continue;
            }
            self.nets.insert(net, (end, "escalation (restored at a restart)".to_owned()));
        }
        deny.write(maps).map(drop)
    }
}
