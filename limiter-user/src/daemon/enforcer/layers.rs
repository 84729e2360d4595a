//! Layers of decisions about a network (the operator's, the policy
//! file's, automation's): which one is in force, how `prefix list` shows
//! them, and the guard against a reload that takes too much away at once.

use std::collections::{BTreeMap, HashSet};

use ipnet::IpNet;

use super::{RuntimeEntry, escalation::Escalations, feedback::Governed};
use crate::clock::unix_now;
use crate::{
    control::{EntryAction, LayerEntry, PrefixEntry},
    policy::{Override, OverrideAction, Policy, runtime::Decider},
};

/// The runtime layers of decisions about networks over the policy
/// file: the operator's overrides and automation's (the tenant layer's
/// penalties, the daemon's escalations), one entry per network and layer,
/// with the governor's account of automation. `Some` adds or replaces,
/// `None` (the operator's only) removes a file override; a layer never
/// replaces another's entry, so when one ends the one beneath is in force
/// again. What they decide is read here; the enforcer records and
/// applies each change, all or nothing.
#[derive(Debug, Default)]
pub struct Layers {
    pub(super) entries: BTreeMap<(IpNet, Decider), RuntimeEntry>,
    /// What the feedback governor decided (see `feedback.rs`).
    pub(super) governor: Governed,
    /// The escalations in force (see `escalation.rs`).
    pub(super) escalations: Escalations,
}

impl Layers {
    /// `base` with the runtime overrides merged in, layer by layer (see
    /// [`Layers::in_force`]): a file override keeps its place (as the
    /// layers make it, or gone if the operator unset it), runtime-only
    /// ones follow in address order.
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        let mut p = base.clone();
        let in_file: HashSet<IpNet> = base.overrides.iter().map(|o| o.net).collect();
        p.overrides = base
            .overrides
            .iter()
            .filter_map(|o| self.in_force(base, o.net, Some(o.action)).map(|f| (f, o.criticality)))
            .map(|((net, action, _), criticality)| Override { net, action, criticality })
            .collect();
        let mut runtime_only: Vec<IpNet> =
            self.entries.keys().map(|(net, _)| *net).filter(|net| !in_file.contains(net)).collect();
        runtime_only.dedup();
        p.overrides.extend(
            runtime_only
                .into_iter()
                .filter_map(|net| self.in_force(base, net, None))
                .map(|(net, action, _)| Override { net, action, criticality: None }),
        );
        p
    }

    /// Removals of automation's entries on `net`.
    pub(super) fn automation_of(&self, net: IpNet) -> Vec<((IpNet, Decider), Option<RuntimeEntry>)> {
        self.entries.range((net, Decider::Feedback)..=(net, Decider::Escalation)).map(|(k, _)| (*k, None)).collect()
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
        let unfit: Vec<((IpNet, Decider), String)> = self
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

    /// The operator's or the file's `allow` that holds `net` (equal or
    /// wider), if any: a penalty there would take away what they allowed.
    /// (An allow inside a wider penalty keeps winning its own addresses:
    /// the longest prefix decides in XDP.)
    pub(super) fn allowed_above(&self, base: &Policy, net: &IpNet) -> Option<(IpNet, Decider)> {
        let operator = self
            .entries
            .iter()
            .filter(|((n, by), e)| {
                *by == Decider::Operator && e.action == Some(OverrideAction::Allow) && n.contains(net)
            })
            .map(|((n, _), _)| (*n, Decider::Operator));
        let file = base
            .overrides
            .iter()
            .filter(|o| o.action == OverrideAction::Allow && o.net.contains(net))
            // The operator may have unset or replaced the file's allow.
            .filter(|o| !self.entries.contains_key(&(o.net, Decider::Operator)))
            .map(|o| (o.net, Decider::File));
        operator.chain(file).max_by_key(|(n, _)| n.prefix_len())
    }

    /// What is in force for `net` (whose file override is `file`) and which
    /// layer said it: the operator's entry, else the file's; automation (a
    /// penalty) overlays either unless it is a `deny` already, or an
    /// `allow` and the policy does not set `feedback.may_override_allow`.
    /// A penalty never removes what is beneath it: when it ends, that is
    /// in force again as it was.
    #[must_use]
    pub fn in_force(
        &self,
        base: &Policy,
        net: IpNet,
        file: Option<OverrideAction>,
    ) -> Option<(IpNet, OverrideAction, Decider)> {
        let upper = match self.entries.get(&(net, Decider::Operator)) {
            Some(e) => e.action.map(|a| (a, Decider::Operator)),
            None => file.map(|a| (a, Decider::File)),
        };
        let auto = self
            .entries
            .range((net, Decider::Feedback)..=(net, Decider::Escalation))
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
        let file: BTreeMap<IpNet, OverrideAction> = base.overrides.iter().map(|o| (o.net, o.action)).collect();
        self.effective(base)
            .overrides
            .iter()
            .map(|o| {
                let (_, _, force) =
                    self.in_force(base, o.net, file.get(&o.net).copied()).unwrap_or((o.net, o.action, Decider::File));
                let mut layers: Vec<LayerEntry> = Vec::new();
                let mut add = |layer: Decider, action: Option<OverrideAction>, expires: Option<u64>| {
                    layers.push(LayerEntry::new(layer, action, expires.map(|t| t.saturating_sub(now)), layer == force));
                };
                if let Some(e) = self.entries.get(&(o.net, Decider::Operator)) {
                    add(Decider::Operator, e.action, e.expires);
                }
                if let Some(a) = file.get(&o.net) {
                    add(Decider::File, Some(*a), None);
                }
                for ((_, by), e) in self.entries.range((o.net, Decider::Feedback)..=(o.net, Decider::Escalation)) {
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
                    reason: force.governed().then(|| self.governor.reasons.get(&o.net).cloned()).flatten(),
                    layers: if layers.len() > 1 { layers } else { Vec::new() },
                    source: None,
                }
            })
            .collect()
    }
}

/// What `next` would take away at once from the running `current` file
/// policy, if it is too much for a reload to do unasked: more than half of
/// its overrides (two or more) lifted, or any token-bucket rate (the
/// default's or a class's, by name) cut more than 10x. `None`: nothing
/// of the kind.
#[must_use]
pub fn shrink(current: &Policy, next: &Policy) -> Option<String> {
    let mut why = Vec::new();
    let kept: HashSet<IpNet> = next.overrides.iter().map(|o| o.net).collect();
    let lifted: Vec<&Override> = current.overrides.iter().filter(|o| !kept.contains(&o.net)).collect();
    if lifted.len() >= 2 && lifted.len() * 2 > current.overrides.len() {
        let denies = lifted.iter().filter(|o| o.action == OverrideAction::Deny).count();
        why.push(format!(
            "it lifts {} of the {} overrides in force ({denies} of them denies)",
            lifted.len(),
            current.overrides.len()
        ));
    }
    let cut = |name: &str, was: &crate::policy::Limit, now: &crate::policy::Limit| {
        (was.window.is_none() && now.window.is_none() && now.rate.saturating_mul(10) < was.rate)
            .then(|| format!("it cuts the {name} rate from {} to {}", was.rate, now.rate))
    };
    why.extend(cut("default", &current.default, &next.default));
    for c in &current.classes {
        if let Some(n) = next.classes.iter().find(|n| n.name == c.name) {
            why.extend(cut(&format!("class {:?}", c.name), &c.limit, &n.limit));
        }
    }
    (!why.is_empty()).then(|| format!("the new policy is refused: {}", why.join("; ")))
}

impl LayerEntry {
    fn new(layer: Decider, action: Option<OverrideAction>, expires_in_secs: Option<u64>, in_force: bool) -> Self {
        let (action, rate, burst) = match action {
            Some(OverrideAction::Limit(l)) => (EntryAction::Limit, Some(l.rate), Some(l.burst)),
            Some(OverrideAction::Allow) => (EntryAction::Allow, None, None),
            Some(OverrideAction::Deny) => (EntryAction::Deny, None, None),
            None => (EntryAction::Unset, None, None),
        };
        LayerEntry { layer: layer.into(), action, rate, burst, expires_in_secs, in_force }
    }
}
