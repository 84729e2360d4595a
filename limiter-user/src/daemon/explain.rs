//! `limiter explain ADDR`: what the data plane would do with the next
//! packet from an address, asked of the state it runs on, layer by layer
//! in the program's order: its class (protocol and port); SYN cookies;
//! the most specific override holding its bucket (the operator's, the
//! file's, a source's, the tenant layer's penalty); without one, its
//! country or ASN group; below an `allow` or `deny` there, the deny set
//! (feeds, CrowdSec, escalation); then its bucket or window quota, the
//! out-of-state TCP check, and the group's shared budget; and what is
//! announced upstream about it.

use std::{fmt::Write as _, net::IpAddr};

use limiter_common::{Reason, cookie, flags, packet, rules};
use serde_json::json;

use super::{features::Features, show::ShowError, view::View};
use crate::{
    clock::human,
    control::{Explain, Layer, PrefixEntry, PrefixShow},
    dataplane::DataPlane,
    engine::Enforcer,
    origin::Origin,
    policy::{Action, Limit, Mode, OverrideAction, Policy, Protocol},
};

/// What `limiter explain` asks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked {
    pub(super) addr: IpAddr,
    pub(super) protocol: Protocol,
    pub(super) port: Option<u16>,
    pub(super) syn: bool,
}

/// What one answer reads, and what it has found so far.
struct Walk<'a> {
    p: &'a Enforcer,
    effective: Policy,
    asked: Asked,
    show: PrefixShow,
    class: usize,
    class_name: String,
    class_limit: Limit,
    bucket: Option<limiter_common::BucketState>,
    layers: Vec<Layer>,
    /// The verdict and which layer gave it, once one has.
    decided: Option<(Reason, &'static str)>,
}

/// `limiter explain`: see the module.
pub(super) fn explain(
    policy: Option<&Enforcer>,
    view: &View,
    features: &Features,
    dp: &DataPlane,
    asked: Asked,
) -> Result<Explain, ShowError> {
    let p = policy.ok_or(ShowError::Changing)?;
    let config = p.config().ok_or(ShowError::NoPolicy)?;
    let effective = p.effective(p.base());
    let src = source(asked);
    let class = rules::classify(config, &src);
    let key = rules::bucket_key(&src, config.v4_prefix, config.v6_prefix, u8::try_from(class).unwrap_or(0));
    let cidr = crate::dataplane::net(&key);
    let mut show = PrefixShow { cidr, windows: Vec::new(), group: None, upstream: Vec::new() };
    features.show(&src, &view.applied(p, &effective), &mut show);
    let class_name = view.class_names.get(class).cloned().unwrap_or_else(|| "default".into());
    let class_limit = if class == 0 { effective.default } else { effective.classes[class - 1].limit };
    let mut w = Walk {
        p,
        asked,
        show,
        class,
        class_limit,
        bucket: dp.maps.counters.bucket(&key),
        layers: vec![Layer::holds(
            "class",
            format!("class {class_name}: {}", limit_words(&class_limit)),
            json!({ "name": class_name, "index": class }),
        )],
        class_name,
        effective,
        decided: None,
    };
    w.cookies(config, dp);
    let (in_force, own_limit) = w.overrides();
    let group_rate = w.group(in_force.is_some());
    w.deny_set();
    w.bucket(own_limit);
    w.tcp_state(config, dp);
    if let Some(name) = group_rate {
        w.layers.push(Layer::holds(
            "group_budget",
            format!("charged to group {name}'s shared budget after its own bucket"),
            json!({ "group": name }),
        ));
    }
    w.upstream();
    // Nothing refused it: its bucket or window admits it.
    let counts = if w.layers.iter().any(|l| l.layer == "window") { "window" } else { "bucket" };
    let (reason, by) = w.decided.unwrap_or((Reason::Admitted, counts));
    if w.decided.is_none()
        && let Some(l) = w.layers.iter_mut().find(|l| l.layer == counts)
    {
        l.decides = true;
    }
    Ok(Explain {
        address: asked.addr,
        protocol: asked.protocol,
        port: asked.port,
        syn: asked.syn,
        version: p.version(),
        cidr,
        verdict: reason.action().label().to_owned(),
        reason: reason.label().to_owned(),
        decided_by: by.to_owned(),
        layers: w.layers,
    })
}

impl Walk<'_> {
    /// `layer` decides with `reason`, unless one before it did.
    fn decide(&mut self, mut layer: Layer, reason: Reason, by: &'static str) {
        if self.decided.is_none() {
            layer.decides = true;
            self.decided = Some((reason, by));
        }
        self.layers.push(layer);
    }

    /// SYN cookies answer a SYN before anything else is asked.
    fn cookies(&mut self, config: &limiter_common::Config, dp: &DataPlane) {
        let mode = config.cookies.mode.get(self.class).copied().unwrap_or(cookie::mode::OFF);
        let tcp = u8::from(self.asked.protocol) == packet::IPPROTO_TCP;
        if config.flags & flags::SYN_COOKIES == 0 || !tcp || mode == cookie::mode::OFF {
            self.layers.push(Layer::nothing("syn_cookies", "off for this packet"));
            return;
        }
        let now = crate::dataplane::maps::monotonic_coarse_ns();
        let class = u32::try_from(self.class).unwrap_or(0);
        let engaged = dp.maps.counters.syn_cookies_engaged(class, now).unwrap_or(false);
        let always = mode == cookie::mode::ALWAYS;
        let word = if always { "always" } else { "auto" };
        let state = match (always, engaged) {
            (false, true) => ", engaged now (a SYN flood)",
            (false, false) => ", not engaged",
            _ => "",
        };
        let mut l = Layer::holds(
            "syn_cookies",
            format!("{word} for class {}{state}", self.class_name),
            json!({ "mode": word, "engaged": always || engaged }),
        );
        if (always || engaged) && self.asked.syn && self.bucket.is_none() {
            l.says += ": a SYN from a prefix without a bucket is answered with a SYN cookie";
            self.decide(l, Reason::SynCookieSent, "syn_cookies");
        } else {
            self.layers.push(l);
        }
    }

    /// Out-of-state TCP: whether the class judges the address's segments
    /// other than SYNs now. It never decides here: its verdict is a
    /// segment's (a connection's 4-tuple), not an address's.
    fn tcp_state(&mut self, config: &limiter_common::Config, dp: &DataPlane) {
        use limiter_common::tcp_state::{mode, of};
        let m = of(config.flags, self.class);
        if m == mode::OFF || u8::from(self.asked.protocol) != packet::IPPROTO_TCP {
            self.layers.push(Layer::nothing("tcp_state", "off for this packet"));
            return;
        }
        let now = crate::dataplane::maps::monotonic_coarse_ns();
        let class = u32::try_from(self.class).unwrap_or(0);
        let always = m == mode::ALWAYS;
        let engaged = always || dp.maps.counters.tcp_state_engaged(class, now).unwrap_or(false);
        let word = if always { "always" } else { "auto" };
        let state = match (always, engaged) {
            (false, true) => ", engaged now (out-of-state segments seen)",
            (false, false) => ", not engaged",
            _ => "",
        };
        let what = match (self.asked.syn, engaged) {
            (true, _) => ": a SYN is not judged",
            (false, true) => {
                ": a segment to a port this host listens on passes only if a connection of this host holds it \
                 (else tcp_out_of_state)"
            }
            (false, false) => "",
        };
        self.layers.push(Layer::holds(
            "tcp_state",
            format!("{word} for class {}{state}{what}", self.class_name),
            json!({ "mode": word, "engaged": engaged }),
        ));
    }

    /// The most specific override holding the bucket prefix decides (an
    /// `allow` or `deny`), or gives its own limits. Returns it and those.
    fn overrides(&mut self) -> (Option<PrefixEntry>, Option<Limit>) {
        let cidr = self.show.cidr;
        let mut overrides: Vec<PrefixEntry> = self
            .p
            .prefixes()
            .into_iter()
            .filter(|e| e.cidr.contains(&cidr) && e.origin.by != Origin::Escalation && !e.origin.shadow)
            .collect();
        overrides.sort_by_key(|e| std::cmp::Reverse(e.cidr.prefix_len()));
        let Some(e) = overrides.first().cloned() else {
            self.layers.push(Layer::nothing("override", "no override holds it"));
            return (None, None);
        };
        let mut l = Layer::holds("override", entry_words(&e), json!(overrides));
        if overrides.len() > 1 {
            let _ = write!(l.says, "; {} wider override(s) beneath it", overrides.len() - 1);
        }
        let own = self.effective.overrides.iter().find(|o| o.net == e.cidr).and_then(|o| match o.action {
            OverrideAction::Limit(l) => Some(l),
            _ => None,
        });
        match e.action {
            Action::Allow => self.decide(l, Reason::Allowed, "override"),
            Action::Deny => self.decide(l, Reason::Denied, "override"),
            _ => self.layers.push(l),
        }
        (Some(e), own)
    }

    /// Without an override, the prefix's group. Returns a rate group's
    /// name (its budget is charged after the bucket).
    fn group(&mut self, held: bool) -> Option<String> {
        let g = self.show.group.clone();
        let name = g.as_ref().and_then(|g| g.group.clone());
        let spec = name.and_then(|n| self.effective.groups.iter().find(|s| s.name == n).cloned());
        let Some(spec) = spec else {
            let says = match &g {
                Some(g) => format!(
                    "in no group (country {}, ASN {})",
                    g.country.as_deref().unwrap_or("unknown"),
                    g.asn.map_or_else(|| "unknown".into(), |a| format!("AS{a}"))
                ),
                None => "the policy names no group".into(),
            };
            self.layers.push(Layer::nothing("group", says));
            return None;
        };
        if held {
            self.layers.push(Layer::nothing("group", "not asked: an override holds the prefix (it is in no group)"));
            return None;
        }
        let g = g.unwrap_or_default();
        let shadow = if spec.shadow { ", shadow" } else { "" };
        let l = Layer::holds(
            "group",
            format!("group {} ({}{shadow}): {}", spec.name, spec.action, g.budget),
            serde_json::to_value(&g).unwrap_or_default(),
        );
        match (spec.action, spec.shadow) {
            (Action::Allow, false) => self.decide(l, Reason::Allowed, "group"),
            (Action::Deny, false) => self.decide(l, Reason::Denied, "group"),
            (Action::Deny, true) => self.decide(l, Reason::ShadowDropped, "group"),
            (Action::Rate, _) => {
                self.layers.push(l);
                return Some(spec.name);
            }
            _ => self.layers.push(l),
        }
        None
    }

    /// Below an `allow` or `deny`, the deny set: its networks holding the
    /// address, with their origins (and an escalation's time left).
    fn deny_set(&mut self) {
        let deny = self.p.deny_layer().covering(self.asked.addr);
        if deny.is_empty() {
            self.layers.push(Layer::nothing("deny_set", "no network of the deny set holds it"));
            return;
        }
        let ends: Vec<PrefixEntry> =
            self.p.prefixes().into_iter().filter(|e| e.origin.by == Origin::Escalation).collect();
        let ends_of = |net: &ipnet::IpNet| ends.iter().find(|e| e.cidr == *net).and_then(|e| e.expires_in_secs);
        let detail: Vec<serde_json::Value> = deny
            .iter()
            .map(|(net, names)| json!({ "cidr": net, "origins": names, "expires_in_secs": ends_of(net) }))
            .collect();
        let words: Vec<String> = deny
            .iter()
            .map(|(net, names)| {
                let ends = ends_of(net).map_or_else(String::new, |s| format!(", ends in {}", human::duration(s)));
                format!("{net} by {}{ends}", names.join(", "))
            })
            .collect();
        let mut l = Layer::holds("deny_set", format!("denied: {}", words.join("; ")), json!(detail));
        if self.decided.is_some() {
            l.says += " (not asked: a layer above decides)";
        }
        self.decide(l, Reason::Denied, "deny_set");
    }

    /// Its bucket (or window quota), under the override's limits if it
    /// has its own.
    fn bucket(&mut self, own_limit: Option<Limit>) {
        let limit = own_limit.unwrap_or(self.class_limit);
        if let Some(win) = limit.window {
            self.layers.push(Layer::nothing("bucket", "the class counts a window quota"));
            let row = self.show.windows.iter().find(|r| r.class == self.class_name).cloned();
            let Some(r) = row else {
                self.layers.push(Layer::nothing("window", format!("nothing counted yet: {0} of {0} left", win.limit)));
                return;
            };
            let l = Layer::holds(
                "window",
                format!(
                    "{} of {} left in this {} s window ({} here, {} on the fleet)",
                    r.remaining, win.limit, r.window_secs, r.local, r.fleet
                ),
                serde_json::to_value(&r).unwrap_or_default(),
            );
            if r.remaining == 0 {
                self.decide(l, limited(limit.mode), "window");
            } else {
                self.layers.push(l);
            }
            return;
        }
        let unit = if limit.cost == crate::policy::CostUnit::Bytes { "bytes" } else { "packets" };
        let Some(t) = self.bucket.map(|b| tokens(&limit, b.tat)) else {
            let budget = self.effective.new_sources.map_or_else(|| ", off".into(), |(r, _)| format!(" of {r}/s"));
            self.layers.push(Layer::nothing(
                "bucket",
                format!(
                    "no bucket yet: the next packet takes one (under the new-source budget{budget}) and finds it full, {} {unit}",
                    limit.burst
                ),
            ));
            return;
        };
        let above = if self.decided.is_some() { " (not asked: a layer above decides)" } else { "" };
        let l = Layer::holds(
            "bucket",
            format!("{t} of {} {unit} left, refilling at {}/s{above}", limit.burst, limit.rate),
            json!({ "tokens": t, "rate": limit.rate, "burst": limit.burst, "cost": unit, "own_limits": own_limit.is_some() }),
        );
        if t == 0 {
            self.decide(l, limited(limit.mode), "bucket");
        } else {
            self.layers.push(l);
        }
    }

    /// What the transit is asked to do before packets get here.
    fn upstream(&mut self) {
        if self.show.upstream.is_empty() {
            self.layers.push(Layer::nothing("upstream", "no rule announced upstream holds it"));
            return;
        }
        let words: Vec<String> =
            self.show.upstream.iter().map(|r| format!("{} {:?} by {:?}", r.key.net, r.action, r.by)).collect();
        self.layers.push(Layer::holds(
            "upstream",
            format!(
                "announced upstream (the transit drops before this host, if it honours them): {}",
                words.join("; ")
            ),
            json!(self.show.upstream),
        ));
    }
}

/// A packet from the address as the program parses one.
fn source(asked: Asked) -> packet::Source {
    let mut src = super::show::source_of(asked.addr);
    src.proto = u8::from(asked.protocol);
    if let Some(port) = asked.port {
        src.dport = port;
        src.port_known = u8::from(matches!(asked.protocol, Protocol::Tcp | Protocol::Udp));
    }
    if asked.syn {
        src.syn = 1;
        src.tcp_flags = packet::tcp_flag::SYN;
    }
    src
}

/// A refusal of the bucket or the window: a drop, or in shadow mode a
/// pass counted as one.
fn limited(mode: Mode) -> Reason {
    if mode == Mode::Shadow { Reason::ShadowDropped } else { Reason::RateLimited }
}

/// Units left in a bucket whose theoretical arrival time is `tat` (1/16
/// ns on the program's clock).
fn tokens(limit: &Limit, tat: u64) -> u64 {
    let now = limiter_common::gcra::to_fixed(crate::dataplane::maps::monotonic_coarse_ns());
    let debt_ns = tat.saturating_sub(now) >> limiter_common::gcra::TIME_SHIFT;
    let owed = u128::from(debt_ns) * u128::from(limit.rate) / 1_000_000_000;
    limit.burst.saturating_sub(u64::try_from(owed).unwrap_or(u64::MAX))
}

/// A class's or an override's limits in words.
fn limit_words(l: &Limit) -> String {
    let mode = if l.mode == Mode::Shadow { ", shadow" } else { "" };
    match l.window {
        Some(w) => format!("window quota of {} per {} s{mode}", w.limit, w.length.as_secs_f64()),
        None => format!("{}/s, burst {} {}{mode}", l.rate, l.burst, l.cost),
    }
}

/// An override entry in words: its network, action, who and when.
fn entry_words(e: &PrefixEntry) -> String {
    let action = match (e.rate, e.burst) {
        (Some(r), Some(b)) => format!("limit {r}/s burst {b}"),
        _ => e.action.to_string(),
    };
    let by = e.source.clone().unwrap_or_else(|| e.origin.label());
    let ends = e.expires_in_secs.map_or_else(String::new, |s| format!(", ends in {}", human::duration(s)));
    let reason = e.reason.as_ref().map_or_else(String::new, |r| format!(", reason {:?}", crate::escape_control(r)));
    format!("{}: {action} by {by}{ends}{reason}", e.cidr)
}
