//! A policy back as a policy file: the file model ([`Root`]) filled from
//! the policy and written by `toml`, so that what is written is what
//! [`parse`](super::parse) reads, field for field.

use toml::Spanned;

use super::{ClassSpec, OverrideSpec, Root, ports::PortSpec};
use crate::policy::{Action, Limit, OverrideAction, Policy, SynCookies, Window};

/// The policy as a policy file that [`parse`](super::parse) reads back to
/// the same policy. A password in a store address is hidden (`policy
/// show` prints this).
#[must_use]
pub fn render(p: &Policy) -> String {
    toml::to_string(&Root::from(p)).unwrap_or_else(|e| format!("# the policy could not be written: {e}\n"))
}

/// A value with no place in a file (the model's spans are for errors).
fn here<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

/// The window-quota fields of a class or an override: `limit`, `window`,
/// `slices`, `scope`, `on_store_failure` (only where it may be given).
type WindowFields = (
    Option<u64>,
    Option<std::time::Duration>,
    Option<u32>,
    Option<crate::policy::Scope>,
    Option<crate::policy::StoreFailure>,
);

fn window_fields(w: Option<Window>) -> WindowFields {
    w.map_or((None, None, None, None, None), |w| {
        let fleet = w.scope == crate::policy::Scope::Fleet;
        (Some(w.limit), Some(w.length), Some(w.slices), Some(w.scope), fleet.then_some(w.on_store_failure))
    })
}

/// `rate` and `burst` of a bucket (none for a window quota).
fn bucket(l: &Limit) -> (Option<u64>, Option<u64>) {
    if l.window.is_some() { (None, None) } else { (Some(l.rate), Some(l.burst)) }
}

impl From<&Policy> for Root {
    fn from(p: &Policy) -> Self {
        let d = p.default;
        Root {
            allow_empty: None,
            allow_shrink: p.allow_shrink.then_some(true),
            mode: Some(here(d.mode)),
            knobs: crate::policy::Knobs::of(p),
            classes: p.classes.iter().map(|c| here(ClassSpec::from(c))).collect(),
            overrides: p.overrides.iter().map(|o| here(OverrideSpec::from(o))).collect(),
            forwards: p.forwards.clone(),
            tunnels: p.tunnels.clone(),
            feedback: p.feedback.clone(),
            feeds: p.feeds.clone(),
            groups: p.groups.clone(),
            sources: p.sources.clone(),
            crowdsec: p.crowdsec.clone(),
            fleet: p.fleet.clone().map(|mut f| {
                f.store = f.store.iter().map(|a| crate::policy::fleet::redacted(a)).collect();
                f
            }),
            upstream: p.upstream.clone(),
            attacks: p.attacks.clone(),
            missing_kernel_feature: p.missing_kernel_feature,
            tcp_state: p.tcp_state,
        }
    }
}

impl From<&crate::policy::Class> for ClassSpec {
    fn from(c: &crate::policy::Class) -> Self {
        let l = c.limit;
        let (rate, burst) = bucket(&l);
        let (limit, window, slices, scope, on_store_failure) = window_fields(l.window);
        ClassSpec {
            name: c.name.clone(),
            protocol: c.protocol,
            ports: c.ports.iter().map(|&(lo, hi)| PortSpec(lo, hi)).collect(),
            source_ports: c.source_ports.iter().map(|&(lo, hi)| PortSpec(lo, hi)).collect(),
            syn: c.syn,
            rate,
            burst,
            cost: Some(l.cost),
            mode: Some(l.mode),
            limit,
            window,
            slices,
            scope,
            on_store_failure,
            syn_cookies: c.syn_cookies,
            syn_rate: c.syn_rate,
            tcp_state: c.tcp_state,
            criticality: (c.criticality != crate::policy::Criticality::Default).then_some(c.criticality),
        }
    }
}

impl From<&crate::policy::Override> for OverrideSpec {
    fn from(o: &crate::policy::Override) -> Self {
        let (action, limits) = match o.action {
            OverrideAction::Allow => (Some(Action::Allow), None),
            OverrideAction::Deny => (Some(Action::Deny), None),
            OverrideAction::Limit(l) => (None, Some(l)),
        };
        let (rate, burst) = limits.map_or((None, None), |l| bucket(&l));
        let (limit, window, slices, scope, on_store_failure) = window_fields(limits.and_then(|l| l.window));
        OverrideSpec {
            cidr: here(o.net.to_string()),
            action,
            rate,
            burst,
            mode: limits.map(|l| l.mode),
            limit,
            window,
            slices,
            scope,
            on_store_failure,
            criticality: o.criticality,
        }
    }
}

/// Whether a class leaves SYN cookies off (the default, not written).
#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
pub(super) fn cookies_off(c: &SynCookies) -> bool {
    *c == SynCookies::Off
}

/// Whether the default class's `tcp_state` is `auto` (the default, not
/// written).
#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
pub(super) fn tcp_state_auto(t: &crate::policy::TcpState) -> bool {
    *t == crate::policy::TcpState::Auto
}

#[cfg(test)]
mod tests;
