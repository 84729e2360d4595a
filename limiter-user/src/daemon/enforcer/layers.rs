//! Layers of decisions about a network (the operator's, the policy
//! file's, automation's): which one is in force, how `prefix list` shows
//! them, and the guard against a reload that takes too much away at once.

use std::collections::{BTreeMap, HashSet};

use ipnet::IpNet;

use super::{ApplyError, Enforcer};
use crate::clock::unix_now;
use crate::{
    control::{EntryAction, LayerEntry, PrefixEntry},
    dataplane::PolicyMaps,
    policy::{Loaded, Override, OverrideAction, Policy, runtime::Decider},
};

impl Enforcer {
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
        let upper = match self.runtime.get(&(net, Decider::Operator)) {
            Some(e) => e.action.map(|a| (a, Decider::Operator)),
            None => file.map(|a| (a, Decider::File)),
        };
        let auto = self
            .runtime
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

    /// [`Enforcer::apply`] of a new version of the file (SIGHUP, `policy
    /// apply`), refused when it would take away too much at once (see
    /// [`shrink`]) unless the file sets `allow_shrink = true` or `force`.
    pub fn apply_guarded(
        &mut self,
        maps: &mut impl PolicyMaps,
        loaded: Loaded,
        force: bool,
    ) -> Result<String, ApplyError> {
        if !force
            && !loaded.policy.allow_shrink
            && self.config.is_some()
            && let Some(why) = shrink(&self.base, &loaded.policy)
        {
            return Err(ApplyError::Request(format!(
                "{why}: refused, as editors and config pushes truncate files; write `allow_shrink = true` in the \
                 file or run `limiter policy apply --force FILE` if it is meant"
            )));
        }
        self.apply(maps, loaded)
    }

    /// One entry per network with an override in force (its top-level
    /// fields are the layer in force), listing every layer that spoke.
    pub(super) fn enforced(&self) -> Vec<PrefixEntry> {
        let now = unix_now();
        let file: BTreeMap<IpNet, OverrideAction> = self.base.overrides.iter().map(|o| (o.net, o.action)).collect();
        self.effective(&self.base)
            .overrides
            .iter()
            .map(|o| {
                let (_, _, force) = self.in_force(&self.base, o.net, file.get(&o.net).copied()).unwrap_or((
                    o.net,
                    o.action,
                    Decider::File,
                ));
                let mut layers: Vec<LayerEntry> = Vec::new();
                let mut add = |layer: Decider, action: Option<OverrideAction>, expires: Option<u64>| {
                    layers.push(LayerEntry::new(layer, action, expires.map(|t| t.saturating_sub(now)), layer == force));
                };
                if let Some(e) = self.runtime.get(&(o.net, Decider::Operator)) {
                    add(Decider::Operator, e.action, e.expires);
                }
                if let Some(a) = file.get(&o.net) {
                    add(Decider::File, Some(*a), None);
                }
                for ((_, by), e) in self.runtime.range((o.net, Decider::Feedback)..=(o.net, Decider::Escalation)) {
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
