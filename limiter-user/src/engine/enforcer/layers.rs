//! Layers of decisions about a network (the operator's, the policy
//! file's, automation's): which one is in force, how `prefix list` shows
//! them, and the guard against a reload that takes too much away at once.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use ipnet::IpNet;

use limiter_common::maps::RUNTIME;

use super::{RuntimeEntry, escalation::Escalations, feedback::Governed};
use crate::clock::unix_now;
use crate::sources::layer::{Decided, SourceLayer};
use crate::{
    control::{LayerEntry, PrefixEntry},
    dataplane::{LoadError, PolicyMaps},
    origin::Origin,
    policy::{Action, Override, OverrideAction, Policy, runtime},
};

/// A change of one network's layer: `None` forgets its entry.
pub(super) type EntryWrite = ((IpNet, Origin), Option<RuntimeEntry>);

/// What a [`Layers::record`] changed, to put back if the apply fails.
#[must_use]
pub(super) struct Undo(Vec<EntryWrite>);

/// The runtime layers of decisions about networks over the policy
/// file: the operator's overrides and automation's (the tenant layer's
/// penalties, the daemon's escalations), one entry per network and layer,
/// with the governor's account of automation. `Some` adds or replaces,
/// `None` (the operator's only) removes a file override; a layer never
/// replaces another's entry, so when one ends the one beneath is in force
/// again. They are recorded here (in the pinned `RUNTIME` map before
/// memory); the enforcer applies each change, all or nothing, and has a
/// change [undone](Layers::undo) if the apply fails.
#[derive(Debug, Default)]
pub struct Layers {
    pub(super) entries: BTreeMap<(IpNet, Origin), RuntimeEntry>,
    /// What the feedback governor decided (see `feedback.rs`).
    pub(super) governor: Governed,
    /// The escalations in force (see `escalation.rs`).
    pub(super) escalations: Escalations,
    /// The `[[source]]` files' networks, below the file's overrides.
    pub(super) sources: SourceLayer,
    /// Why the operator set each of their entries (`--reason`), kept in
    /// memory: the pinned record has no room for text, so a restart keeps
    /// the entry and loses its reason (the audit trail has it).
    pub(super) reasons: BTreeMap<IpNet, String>,
}

impl Layers {
    /// Record `changes` (`None` forgets an entry), in the pinned `RUNTIME`
    /// map and then here, so a daemon that dies right after the apply
    /// still puts them back when it restarts. On a failure what was
    /// recorded is put back; on success the returned [`Undo`] does so if
    /// the apply that follows fails.
    pub(super) fn record(&mut self, maps: &mut impl PolicyMaps, changes: &[EntryWrite]) -> Result<Undo, LoadError> {
        let previous: Vec<EntryWrite> = changes.iter().map(|(k, _)| (*k, self.entries.get(k).copied())).collect();
        for (done, (at, entry)) in changes.iter().enumerate() {
            if let Err(e) = self.record_one(maps, *at, *entry) {
                self.undo(maps, Undo(previous.into_iter().take(done).collect()));
                return Err(e);
            }
        }
        Ok(Undo(previous))
    }

    /// Put the entries an [`Undo`] names back as they were.
    pub(super) fn undo(&mut self, maps: &mut impl PolicyMaps, undo: Undo) {
        for (at, entry) in undo.0.into_iter().rev() {
            if let Err(e) = self.record_one(maps, at, entry) {
                tracing::warn!("limiter: runtime override of {} not restored in {RUNTIME}: {e}", at.0);
            }
        }
    }

    /// Set (`Some`) or forget (`None`) the runtime entry of a network's
    /// layer, in the `RUNTIME` map and then in memory.
    fn record_one(
        &mut self,
        maps: &mut impl PolicyMaps,
        at: (IpNet, Origin),
        entry: Option<RuntimeEntry>,
    ) -> Result<(), LoadError> {
        let value = entry.map(|e| {
            let expires = e.expires.map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX));
            runtime::value(e.action.as_ref(), expires, at.1)
        });
        maps.set_runtime_override(&runtime::key(&at.0, at.1), value.as_ref())?;
        match entry {
            Some(e) => self.entries.insert(at, e),
            None => self.entries.remove(&at),
        };
        Ok(())
    }

    /// Read back the overrides a previous daemon set at run time (kept in
    /// the pinned `RUNTIME` map); entries this build cannot read are
    /// skipped with a warning. Returns the escalations recorded there,
    /// with their ends: the deny set holds them (see
    /// [`Escalations::restore`]).
    pub(super) fn restore(&mut self, maps: &mut impl PolicyMaps) -> Result<Vec<(IpNet, u64)>, LoadError> {
        let mut escalations = Vec::new();
        for (k, v) in maps.runtime_overrides()? {
            let Some((net, action, expires, origin)) = runtime::decode(&k, &v) else {
                tracing::warn!("limiter: skipped an unreadable entry of {RUNTIME}: {k:?}");
                continue;
            };
            let expires = (expires != 0).then_some(u64::from(expires));
            // A record of a build before layers: moved under its layer's
            // key, so that its removal finds it.
            let stale = runtime::stale_key(&k, origin);
            if stale {
                maps.set_runtime_override(&k, None)?;
            }
            // Escalations are the deny set's (a build before it kept them
            // as overrides of whole buckets: those move too). One without
            // an end never came from escalation: it ends now.
            if origin == Origin::Escalation {
                let end = expires.unwrap_or(0);
                if stale {
                    super::escalation::set_record(maps, &net, Some(end))?;
                }
                escalations.push((net, end));
                continue;
            }
            let entry = RuntimeEntry { action, expires, by: origin };
            if stale {
                self.record_one(maps, (net, origin), Some(entry))?;
            }
            self.entries.insert((net, origin), entry);
        }
        Ok(escalations)
    }

    /// The operator's change of `net`: an entry of theirs (`action`), or
    /// an unset: a runtime-only override is forgotten, the file's is
    /// removed by an entry of its own, and with neither automation's go
    /// (the operator outranks automation). Empty: nothing to unset.
    pub(super) fn operator(
        &mut self,
        net: IpNet,
        action: Option<OverrideAction>,
        expires: Option<u64>,
        in_file: bool,
    ) -> Vec<EntryWrite> {
        let operator = self.entries.get(&(net, Origin::Operator)).copied();
        let entry = |action| Some(RuntimeEntry { action, expires, by: Origin::Operator });
        if action.is_some() {
            return vec![((net, Origin::Operator), entry(action))];
        }
        let changes = match (operator, in_file) {
            (Some(e), true) if e.action.is_none() => self.automation_of(net),
            (_, true) => vec![((net, Origin::Operator), entry(None))],
            (Some(_), false) => vec![((net, Origin::Operator), None)],
            (None, false) => self.automation_of(net),
        };
        self.forget_reasons(&changes);
        changes
    }

    /// The entries whose time is up at `now`, to forget (and the shadow
    /// decisions, forgotten now).
    pub(super) fn due(&mut self, now: u64) -> Vec<EntryWrite> {
        self.governor.expire_shadow(now);
        let due: Vec<EntryWrite> =
            self.entries.iter().filter(|(_, e)| e.expires.is_some_and(|t| t <= now)).map(|(k, _)| (*k, None)).collect();
        self.forget_reasons(&due);
        due
    }

    /// The entries among `changes` lose the reason they were asked for.
    pub(super) fn forget_reasons(&mut self, changes: &[EntryWrite]) {
        for ((n, by), _) in changes {
            if by.governed() {
                self.governor.reasons.remove(n);
            } else if *by == Origin::Operator {
                self.reasons.remove(n);
            }
        }
    }

    /// `base` with the runtime overrides merged in, layer by layer (see
    /// [`Layers::in_force`]): a file override keeps its place (as the
    /// layers make it, or gone if the operator unset it), runtime-only
    /// ones follow in address order.
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        let sources = self.sources.decided(base);
        let mut p = base.clone();
        let in_file: HashSet<IpNet> = base.overrides.iter().map(|o| o.net).collect();
        p.overrides = base
            .overrides
            .iter()
            .filter_map(|o| self.in_force(base, &sources, o.net, Some(o.action)).map(|f| (f, o.criticality)))
            .map(|((net, action, _), criticality)| Override { net, action, criticality })
            .collect();
        let runtime_only: BTreeSet<IpNet> = self
            .entries
            .keys()
            .map(|(net, _)| *net)
            .chain(sources.keys().copied())
            .filter(|net| !in_file.contains(net))
            .collect();
        p.overrides.extend(
            runtime_only
                .into_iter()
                .filter_map(|net| self.in_force(base, &sources, net, None))
                .map(|(net, action, _)| Override { net, action, criticality: None }),
        );
        p
    }

    /// Removals of automation's entries on `net`.
    fn automation_of(&self, net: IpNet) -> Vec<EntryWrite> {
        self.entries.range((net, Origin::Feedback)..=(net, Origin::Escalation)).map(|(k, _)| (*k, None)).collect()
    }

    /// The overrides in force, with where each came from, then the
    /// escalations and the feedback's shadow decisions.
    #[must_use]
    pub fn prefixes(&self, base: &Policy) -> Vec<PrefixEntry> {
        let mut list = self.enforced(base);
        list.extend(self.escalations.entries());
        list.extend(self.governor.shadow_entries());
        list
    }

    /// When the next entry, shadow decision or escalation ends.
    #[must_use]
    pub fn next_end(&self) -> Option<u64> {
        self.entries
            .values()
            .filter_map(|e| e.expires)
            .chain(self.governor.next_shadow_expiry())
            .chain(self.escalations.next_end())
            .min()
    }

    /// Set aside restored runtime overrides that `base` cannot hold (a /24
    /// deny under a policy whose buckets are now /16, a limit no longer
    /// valid), so that they cannot keep a restarted daemon from starting.
    /// They stay in the pinned `RUNTIME` record, not applied: a restart
    /// with a policy that holds them again puts them back (a SIGHUP with
    /// the same change is refused, and a restart must not lose more).
    /// Returns each one with why.
    pub fn drop_unfit(&mut self, base: &Policy) -> Vec<String> {
        let unfit: Vec<((IpNet, Origin), String)> = self
            .entries
            .iter()
            .filter_map(|(&(net, by), action)| {
                let bucket = if net.addr().is_ipv4() { base.v4_prefix } else { base.v6_prefix };
                if u32::from(net.prefix_len()) > bucket {
                    return Some(((net, by), format!("finer than the policy's /{bucket} buckets")));
                }
                match action.action {
                    Some(OverrideAction::Limit(l)) => l.to_kernel("").err().map(|e| ((net, by), e.to_string())),
                    _ => None,
                }
            })
            .collect();
        unfit
            .into_iter()
            .map(|(at, why)| {
                self.entries.remove(&at);
                format!("{} ({why})", at.0)
            })
            .collect()
    }

    /// The operator's, the file's or a source's `allow` that holds `net` (equal or
    /// wider), if any: a penalty there would take away what they allowed.
    /// (An allow inside a wider penalty keeps winning its own addresses:
    /// the longest prefix decides in XDP.)
    pub(super) fn allowed_above(&self, base: &Policy, net: &IpNet) -> Option<(IpNet, Origin)> {
        let operator = self
            .entries
            .iter()
            .filter(|((n, by), e)| {
                *by == Origin::Operator && e.action == Some(OverrideAction::Allow) && n.contains(net)
            })
            .map(|((n, _), _)| (*n, Origin::Operator));
        let file = base
            .overrides
            .iter()
            .filter(|o| o.action == OverrideAction::Allow && o.net.contains(net))
            // The operator may have unset or replaced the file's allow.
            .filter(|o| !self.entries.contains_key(&(o.net, Origin::Operator)))
            .map(|o| (o.net, Origin::File));
        let sources = self.sources.decided(base);
        let source = sources
            .iter()
            .filter(|(n, d)| d.action == OverrideAction::Allow && n.contains(net))
            // The operator or the file may have said otherwise there.
            .filter(|(n, _)| {
                !self.entries.contains_key(&(**n, Origin::Operator)) && !base.overrides.iter().any(|o| o.net == **n)
            })
            .map(|(n, _)| (*n, Origin::Source));
        operator.chain(file).chain(source).max_by_key(|(n, _)| n.prefix_len())
    }

    /// What is in force for `net` (whose file override is `file`, and
    /// what the sources decide, `sources`) and which layer said it: the
    /// operator's entry, else the file's, else a source's; automation (a
    /// penalty) overlays any of them unless it is a `deny` already, or an
    /// `allow` and the policy does not set `feedback.may_override_allow`.
    /// A penalty never removes what is beneath it: when it ends, that is
    /// in force again as it was.
    fn in_force(
        &self,
        base: &Policy,
        sources: &BTreeMap<IpNet, Decided<'_>>,
        net: IpNet,
        file: Option<OverrideAction>,
    ) -> Option<(IpNet, OverrideAction, Origin)> {
        let upper = match self.entries.get(&(net, Origin::Operator)) {
            Some(e) => e.action.map(|a| (a, Origin::Operator)),
            None => file.map(|a| (a, Origin::File)).or_else(|| sources.get(&net).map(|d| (d.action, Origin::Source))),
        };
        let auto = self
            .entries
            .range((net, Origin::Feedback)..=(net, Origin::Escalation))
            .find_map(|((_, by), e)| e.action.map(|a| (a, *by)));
        let may_override_allow = base.feedback.as_ref().is_some_and(|f| f.may_override_allow);
        let chosen = match (upper, auto) {
            (Some((OverrideAction::Deny, _)), _) | (Some(_), None) => upper,
            (Some((OverrideAction::Allow, _)), Some(_)) if !may_override_allow => upper,
            (_, a) => a,
        };
        chosen.map(|(a, l)| (net, a, l))
    }

    /// One entry per network with an override in force (its top-level
    /// fields are the layer in force), listing every layer that spoke.
    fn enforced(&self, base: &Policy) -> Vec<PrefixEntry> {
        let now = unix_now();
        let sources = self.sources.decided(base);
        let file: BTreeMap<IpNet, OverrideAction> = base.overrides.iter().map(|o| (o.net, o.action)).collect();
        self.effective(base)
            .overrides
            .iter()
            .map(|o| {
                let (_, _, force) = self.in_force(base, &sources, o.net, file.get(&o.net).copied()).unwrap_or((
                    o.net,
                    o.action,
                    Origin::File,
                ));
                let source = sources.get(&o.net);
                let mut layers: Vec<LayerEntry> = Vec::new();
                let mut add = |layer: Origin, action: Option<OverrideAction>, expires: Option<u64>| {
                    layers.push(LayerEntry::new(layer, action, expires.map(|t| t.saturating_sub(now)), layer == force));
                };
                if let Some(e) = self.entries.get(&(o.net, Origin::Operator)) {
                    add(Origin::Operator, e.action, e.expires);
                }
                if let Some(a) = file.get(&o.net) {
                    add(Origin::File, Some(*a), None);
                }
                if let Some(d) = source {
                    add(Origin::Source, Some(d.action), None);
                }
                for ((_, by), e) in self.entries.range((o.net, Origin::Feedback)..=(o.net, Origin::Escalation)) {
                    add(*by, e.action, e.expires);
                }
                let top = layers
                    .iter()
                    .find(|l| l.in_force)
                    .cloned()
                    .unwrap_or_else(|| LayerEntry::new(force, Some(o.action), None, true));
                PrefixEntry {
                    cidr: o.net,
                    action: top.action,
                    rate: top.rate,
                    burst: top.burst,
                    origin: top.layer,
                    expires_in_secs: top.expires_in_secs,
                    reason: match force {
                        f if f.governed() => self.governor.reasons.get(&o.net).cloned(),
                        Origin::Operator => self.reasons.get(&o.net).cloned(),
                        _ => None,
                    },
                    layers: if layers.len() > 1 { layers } else { Vec::new() },
                    source: source
                        .filter(|_| force == Origin::Source)
                        .map(|d| crate::origin::Named::source(d.by).to_string()),
                }
            })
            .collect()
    }
}

impl LayerEntry {
    fn new(layer: Origin, action: Option<OverrideAction>, expires_in_secs: Option<u64>, in_force: bool) -> Self {
        let (action, rate, burst) = match action {
            Some(OverrideAction::Limit(l)) => (Action::Limit, Some(l.rate), Some(l.burst)),
            Some(a) => (a.action(), None, None),
            None => (Action::Unset, None, None),
        };
        LayerEntry { layer: layer.into(), action, rate, burst, expires_in_secs, in_force }
    }
}
