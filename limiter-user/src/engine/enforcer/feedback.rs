//! Penalties from the tenant layer, under the governor of the policy's
//! `[feedback]` section: a deny with a TTL, refused past the cap, wider
//! than the minimum prefix length or longer than the longest TTL; in
//! shadow mode only listed and logged.

use std::collections::{BTreeMap, HashMap};

use ipnet::IpNet;

use super::{ApplyError, Layers, RuntimeEntry};
use crate::clock::unix_now;
use crate::{
    control::{PrefixEntry, Shown},
    origin::Origin,
    policy::{Action, OverrideAction, Policy, feedback::Refusal},
};

/// What the governor decided, since the daemon started.
#[derive(Clone, Debug, Default)]
pub struct Governed {
    /// Why each feedback override was asked for (kept in memory).
    pub reasons: HashMap<IpNet, String>,
    /// Shadow decisions: listed and logged, not enforced (expiry, reason,
    /// who decided).
    pub shadow: BTreeMap<IpNet, (u64, String, Origin)>,
    pub applied: u64,
    pub shadowed: u64,
    /// Refusals of the governor, by why.
    pub refused: crate::policy::feedback::Refusals,
}

impl Governed {
    pub(super) fn expire_shadow(&mut self, now: u64) {
        self.shadow.retain(|_, (t, _, _)| *t > now);
    }

    pub(super) fn next_shadow_expiry(&self) -> Option<u64> {
        self.shadow.values().map(|(t, _, _)| *t).min()
    }

    /// The shadow decisions as list entries.
    #[must_use]
    pub fn shadow_entries(&self) -> Vec<PrefixEntry> {
        let now = unix_now();
        self.shadow
            .iter()
            .map(|(net, (t, why, by))| PrefixEntry {
                cidr: *net,
                action: Action::Deny,
                rate: None,
                burst: None,
                origin: Shown::shadow(*by),
                expires_in_secs: Some(t.saturating_sub(now)),
                reason: Some(why.clone()),
                layers: Vec::new(),
                source: None,
            })
            .collect()
    }
}

/// What the governor makes of a penalty it allows.
pub(super) enum Judged {
    /// Shadow mode: listed and logged, not enforced (the summary).
    Shadow(String),
    /// A deny of whole buckets, an entry of the penalty's layer.
    Deny(IpNet, RuntimeEntry),
    /// An escalation: an address in the deny set until the end.
    Escalate(IpNet, u64),
}

/// Judge a penalty of `cidr` for `ttl` seconds asked by `by` (the tenant
/// layer, or the daemon's own escalation) under `base`'s governor, with
/// the entries `layers` hold: refused (counted and logged), shadowed, or
/// what to apply.
pub(super) fn judge(
    layers: &mut Layers,
    base: &Policy,
    net: Result<&IpNet, &String>,
    ttl: u64,
    reason: &str,
    by: Origin,
) -> Result<Judged, ApplyError> {
    let origin = by.label();
    let cidr = net.map_or_else(Clone::clone, ToString::to_string);
    let Some(g) = base.feedback.clone() else {
        return Err(ApplyError::Request("feedback is not configured ([feedback] in the policy)".into()));
    };
    let refuse = |governor: &mut Governed, r: Refusal, why: String| {
        governor.refused.bump(r);
        tracing::warn!(event = "feedback", decision = "refused", origin, cidr, reason = %reason, "limiter: governor refused a penalty: {why}");
        Err(ApplyError::Governor { refusal: r, message: why })
    };
    let net = match net {
        Ok(n) => *n,
        Err(text) => {
            let why = format!("{text:?} is not a CIDR without host bits");
            return refuse(&mut layers.governor, Refusal::BadRequest, why);
        }
    };
    // A tenant's penalty is an override of whole buckets; an escalation
    // is an address in the deny set (see `escalation.rs`).
    let escalation = by == Origin::Escalation;
    let bucket = if net.addr().is_ipv4() { base.v4_prefix } else { base.v6_prefix };
    if !escalation && u32::from(net.prefix_len()) > bucket {
        let why = format!("{net} is finer than the bucket prefix /{bucket}");
        return refuse(&mut layers.governor, Refusal::BadRequest, why);
    }
    // Each kind of automation has its own cap: escalations cannot spend
    // the tenant's, nor the tenant's the escalations'.
    let denied = if escalation {
        layers.escalations.nets.keys().filter(|n| **n != net).count()
    } else {
        layers.entries.keys().filter(|(n, b)| *b == by && *n != net).count()
    };
    let cap = if escalation { g.escalate.map_or(g.max_denied, |e| e.max_denied) } else { g.max_denied };
    let allowed_above = layers.allowed_above(base, &net);
    // The deny set lies beneath every allow: an escalation there would be
    // listed and not enforced, so it is refused whatever the policy.
    let g = if escalation { crate::policy::feedback::Feedback { may_override_allow: false, ..g } } else { g };
    if let Err(r) = g.govern(&net, ttl, denied, cap, allowed_above.is_some()) {
        let why = match r {
            Refusal::TooWide => format!("{net} is wider than the governor allows"),
            Refusal::TtlTooLong => format!("a TTL of {ttl} s is past the governor's {} s", g.max_ttl.as_secs()),
            Refusal::Cap if by == Origin::Escalation => {
                format!("{cap} prefixes are denied by escalation already (feedback.escalate.max_denied)")
            }
            Refusal::Cap => format!("{cap} prefixes are denied by feedback already (max_denied)"),
            Refusal::BadRequest => "a penalty needs a TTL".into(),
            Refusal::Allowed => format!(
                "{net} is inside {}, which the {} allows; automation does not override an allow (unless the \
                 policy sets feedback.may_override_allow = true)",
                allowed_above.map_or_else(String::new, |(n, _)| n.to_string()),
                allowed_above.map_or("", |(_, l)| match l {
                    Origin::File => "policy file",
                    Origin::Source => "[[source]] file",
                    _ => "operator",
                }),
            ),
        };
        return refuse(&mut layers.governor, r, why);
    }
    let expires = unix_now() + ttl;
    if g.shadow {
        layers.governor.shadow.insert(net, (expires, reason.to_owned(), by));
        layers.governor.shadowed += 1;
        tracing::info!(event = "feedback", decision = "shadow", origin, cidr = %net, ttl, reason = %reason, "limiter: {origin} (shadow): would deny {net} for {ttl} s: {reason}");
        return Ok(Judged::Shadow(format!("shadow: {net} would be denied for {ttl} s (not enforced)")));
    }
    Ok(if escalation {
        Judged::Escalate(net, expires)
    } else {
        Judged::Deny(net, RuntimeEntry { action: Some(OverrideAction::Deny), expires: Some(expires), by })
    })
}

impl Governed {
    /// A penalty the governor allowed is in force.
    pub(super) fn applied(&mut self, net: IpNet, ttl: u64, reason: &str, by: Origin) {
        // An escalation keeps its reason with it (see `escalation.rs`).
        if by != Origin::Escalation {
            self.reasons.insert(net, reason.to_owned());
        }
        self.applied += 1;
        let origin = by.label();
        tracing::info!(event = "feedback", decision = "applied", origin, cidr = %net, ttl, reason = %reason, "limiter: {origin}: denied {net} for {ttl} s: {reason}");
    }
}
