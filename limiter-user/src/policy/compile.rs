//! The one place a policy is validated and turned into the kernel's form:
//! [`Policy::compile`] returns the `Config` and the override entries
//! together, or the path of the first bad field (invariant 6). The daemon
//! calls it once per apply; nothing touches the kernel before it succeeds.

use std::collections::HashSet;

use ipnet::IpNet;
use limiter_common::{
    ClassLimits, Config, MAX_CLASSES, MAX_MATCHERS, MAX_V6_BUCKET_PREFIX, Matcher, flags, gcra,
    maps::{MAX_BUCKET_CAPACITY, MAX_OVERRIDES},
    port_side, resolution,
};

use super::{
    CostUnit, Limit, MIN_BYTE_BURST, Mode, Override, OverrideAction, Policy, PolicyError, Scope, StoreFailure, Window,
    bad,
};

/// A policy in the kernel's form, ready to be written to an idle slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    pub config: Config,
    pub overrides: CompiledOverrides,
    /// Each `[[group]]`'s limits, by index (`GROUP_LIMITS`).
    pub groups: Vec<limiter_common::groups::GroupLimits>,
}

/// Overrides in the form the kernel's tries and `OVR_LIMITS` take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledOverrides {
    /// (prefix length, address in network byte order, resolution code).
    pub v4: Vec<(u32, u32, u32)>,
    pub v6: Vec<(u32, [u32; 4], u32)>,
    /// Limits of override code `n` at index `n - 1`.
    pub limits: Vec<ClassLimits>,
}

#[cfg(test)]
thread_local! {
    /// Calls of [`Policy::compile`] on this thread (tests check that an
    /// apply compiles once).
    pub static COMPILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Limit {
    /// Check the limit and derive the kernel's form. `at` prefixes field names.
    pub fn to_kernel(&self, at: &str) -> Result<ClassLimits, PolicyError> {
        let Self { rate, burst, cost, mode, window } = *self;
        if let Some(w) = window {
            return w.to_kernel(at, cost, mode);
        }
        if !(1..=gcra::MAX_RATE).contains(&rate) {
            return Err(bad(format!("{at}rate"), format!("{rate} is outside 1..={}", gcra::MAX_RATE)));
        }
        let min_burst = match cost {
            CostUnit::Packets => 1,
            CostUnit::Bytes => MIN_BYTE_BURST,
        };
        if burst < min_burst {
            return Err(bad(
                format!("{at}burst"),
                format!("{burst} is below {min_burst}, the least a bucket of {cost} must hold"),
            ));
        }
        ClassLimits::new(rate, burst, cost.into(), mode.into())
            .ok_or_else(|| bad(format!("{at}burst"), format!("{burst} is too large for rate {rate}")))
    }
}

impl Window {
    fn to_kernel(self, at: &str, cost: CostUnit, mode: Mode) -> Result<ClassLimits, PolicyError> {
        use limiter_common::window::{self, scope};
        let Self { limit, length, slices, scope: sc, on_store_failure } = self;
        if !(1..=window::MAX_LIMIT).contains(&limit) {
            return Err(bad(format!("{at}limit"), format!("{limit} is outside 1..={}", window::MAX_LIMIT)));
        }
        if slices < 2 || usize::try_from(slices).is_ok_and(|n| n > window::MAX_SLICES) {
            return Err(bad(format!("{at}slices"), format!("{slices} is outside 2..={}", window::MAX_SLICES)));
        }
        let ns = u64::try_from(length.as_nanos()).unwrap_or(u64::MAX);
        let slice = ns / u64::from(slices);
        if ns % u64::from(slices) != 0 || !(window::MIN_SLICE_NS..=window::MAX_SLICE_NS).contains(&slice) {
            return Err(bad(
                format!("{at}window"),
                format!(
                    "{length:?} in {slices} slices: give a window that splits into whole nanoseconds of 1 ms to 1 h each"
                ),
            ));
        }
        let bits = match sc {
            Scope::Local => 0,
            Scope::Fleet => scope::FLEET,
        } | match on_store_failure {
            StoreFailure::Open => 0,
            StoreFailure::Split => scope::SPLIT_ON_FAILURE,
        };
        ClassLimits::window(limit, slice, slices, bits, cost.into(), mode.into())
            .ok_or_else(|| bad(format!("{at}window"), "outside the bounds of a window quota"))
    }
}

impl Policy {
    /// Check every field and derive the data-plane config, stamped
    /// `version`, and the override entries.
    pub fn compile(&self, version: u64) -> Result<Compiled, PolicyError> {
        #[cfg(test)]
        COMPILES.with(|c| c.set(c.get() + 1));
        let Self {
            default,
            classes,
            overrides,
            new_sources,
            aggregate,
            v4_prefix,
            v6_prefix,
            capacity,
            forwards,
            tunnels,
            feedback,
            feeds,
            groups,
            sources,
            crowdsec,
            fleet,
            upstream,
            attacks,
            // Only a reload reads it (the daemon's guard).
            allow_shrink: _,
            // The daemon reads it against the kernel it runs on.
            missing_kernel_feature: _,
            tcp_state,
        } = self;
        super::forward::check(forwards)?;
        crate::tunnel::section::check(tunnels)?;
        crate::tunnel::section::check_classes(tunnels, classes)?;
        if let Some(f) = fleet {
            super::fleet::check(f)?;
        }
        if let Some(f) = feedback {
            super::feedback::check(f)?;
        }
        super::feed::check(feeds)?;
        let groups = crate::groups::section::check(groups)?;
        crate::sources::section::check(sources)?;
        if let Some(c) = crowdsec {
            super::crowdsec::check(c)?;
        }
        if let Some(u) = upstream {
            super::upstream::check(u)?;
        }
        super::attacks::check(attacks)?;
        if *v4_prefix > 32 {
            return Err(bad("v4_prefix", format!("{v4_prefix} is longer than 32")));
        }
        if *v6_prefix > MAX_V6_BUCKET_PREFIX {
            return Err(bad(
                "v6_prefix",
                format!(
                    "{v6_prefix} is longer than {MAX_V6_BUCKET_PREFIX} (a host holds a whole /64: finer buckets are \
                     bypassed by rotating addresses)"
                ),
            ));
        }
        if !(1..=MAX_BUCKET_CAPACITY).contains(capacity) {
            return Err(bad("capacity", format!("{capacity} is outside 1..={MAX_BUCKET_CAPACITY}")));
        }
        let mut config = Config {
            version,
            v4_prefix: *v4_prefix,
            v6_prefix: *v6_prefix,
            flags: flags::CONFIGURED,
            drop_sample: limiter_common::DROP_SAMPLE,
            ..Config::default()
        };
        config.classes[0] = default.to_kernel("")?;
        if let Some(a) = aggregate {
            for (field, agg, bucket) in
                [("aggregate_v4_prefix", a.v4_prefix, *v4_prefix), ("aggregate_v6_prefix", a.v6_prefix, *v6_prefix)]
            {
                if agg > bucket {
                    return Err(bad(field, format!("/{agg} is finer than the bucket prefix /{bucket}")));
                }
            }
            let k = Limit { rate: a.rate, burst: a.burst, cost: default.cost, mode: Mode::Enforce, window: None }
                .to_kernel("aggregate_")?;
            (config.agg_unit, config.agg_tau, config.agg_v4_prefix, config.agg_v6_prefix) =
                (k.unit, k.tau, a.v4_prefix, a.v6_prefix);
        }
        if let Some((rate, burst)) = *new_sources {
            let budget = Limit { rate, burst, cost: CostUnit::Packets, mode: Mode::Enforce, window: None };
            let k = budget.to_kernel("new_source_")?;
            (config.new_unit, config.new_tau) = (k.unit, k.tau);
        }
        compile_classes(classes, &mut config)?;
        super::cookies::compile(classes, new_sources.map(|(rate, _)| rate), &mut config)?;
        super::tcp_state::compile(*tcp_state, classes, &mut config)?;
        if !tunnels.is_empty() {
            config.flags |= flags::TUNNELS;
        }
        let overrides = compile_overrides(overrides, *v4_prefix, *v6_prefix)?;
        Ok(Compiled { config, overrides, groups })
    }
}

impl Policy {
    /// What is valid but probably not meant: a prefix length 0 (every
    /// source in one bucket) or an override that denies every source.
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (field, len, fam) in [("v4_prefix", self.v4_prefix, "IPv4"), ("v6_prefix", self.v6_prefix, "IPv6")] {
            if len == 0 {
                w.push(format!("{field} = 0: every {fam} source shares one bucket"));
            }
        }
        for (i, o) in self.overrides.iter().enumerate() {
            if o.net.prefix_len() == 0 && o.action == OverrideAction::Deny {
                let fam = if o.net.addr().is_ipv4() { "IPv4" } else { "IPv6" };
                w.push(format!("override[{i}] denies every {fam} source ({})", o.net));
            }
        }
        w
    }
}

fn compile_classes(classes: &[super::Class], config: &mut Config) -> Result<(), PolicyError> {
    if classes.len() > MAX_CLASSES - 1 {
        return Err(bad("class", format!("{} classes, at most {} fit", classes.len(), MAX_CLASSES - 1)));
    }
    let mut n = 0;
    for (i, c) in classes.iter().enumerate() {
        let at = format!("class[{i}].");
        if c.name.is_empty() || classes[..i].iter().any(|o| o.name == c.name) {
            return Err(bad(format!("{at}name"), format!("{:?} is empty or used twice", c.name)));
        }
        let proto = u8::from(c.protocol);
        if c.syn && c.protocol != super::Protocol::Tcp {
            return Err(bad(format!("{at}syn"), "syn = true needs protocol = \"tcp\""));
        }
        if !c.ports.is_empty() && !c.source_ports.is_empty() {
            let problem = "a class matches destination ports or source ports, not both (a reflection class names \
                           the source ports of the services whose answers it holds)";
            return Err(bad(format!("{at}source_ports"), problem));
        }
        let (field, side, ranges) = if c.source_ports.is_empty() {
            ("ports", port_side::DESTINATION, &c.ports)
        } else {
            ("source_ports", port_side::SOURCE, &c.source_ports)
        };
        if !ranges.is_empty() && !matches!(c.protocol, super::Protocol::Tcp | super::Protocol::Udp) {
            return Err(bad(format!("{at}{field}"), format!("{field} need protocol = \"tcp\" or \"udp\"")));
        }
        config.classes[i + 1] = c.limit.to_kernel(&at)?;
        // A UDP reflection class's refusals are asked of this host's
        // sockets: an answer to one it connected passes.
        if side == port_side::SOURCE && c.protocol == super::Protocol::Udp {
            config.flags |= 1 << (flags::ANSWERS_SHIFT as usize + i + 1);
        }
        let ranges: &[(u16, u16)] = if ranges.is_empty() { &[(0, u16::MAX)] } else { ranges };
        for &(lo, hi) in ranges {
            if lo > hi {
                return Err(bad(format!("{at}{field}"), format!("range {lo}-{hi} is empty")));
            }
            let Some(m) = config.matchers.get_mut(n) else {
                return Err(bad(
                    format!("{at}{field}"),
                    format!("more than {MAX_MATCHERS} port ranges in all classes"),
                ));
            };
            let class = u8::try_from(i + 1).expect("fewer than MAX_CLASSES");
            *m = Matcher { proto, syn: u8::from(c.syn), class, side, port_lo: lo, port_hi: hi };
            n += 1;
        }
    }
    config.n_matchers = u32::try_from(n).expect("bounded by MAX_MATCHERS");
    Ok(())
}

/// Why `net` cannot be an override under bucket prefixes `v4` and `v6`
/// (host bits, or finer than a bucket), in words naming `net` itself:
/// the file's overrides, the operator's and a bulk load's say it alike.
pub fn override_net(net: IpNet, v4: u32, v6: u32) -> Result<(), String> {
    if net.trunc() != net {
        return Err(format!("{net} has host bits set (did you mean {}?)", net.trunc()));
    }
    let bucket = if net.addr().is_ipv4() { v4 } else { v6 };
    if u32::from(net.prefix_len()) > bucket {
        return Err(format!("{net} is longer than the bucket prefix /{bucket}: an override covers whole buckets"));
    }
    Ok(())
}

/// Linear in the number of overrides: one pass, one hash set for duplicates.
fn compile_overrides(list: &[Override], v4: u32, v6: u32) -> Result<CompiledOverrides, PolicyError> {
    if list.len() > MAX_OVERRIDES as usize {
        return Err(bad("override", format!("{} overrides, at most {MAX_OVERRIDES} fit", list.len())));
    }
    let mut out = CompiledOverrides::default();
    let mut seen = HashSet::with_capacity(list.len());
    for (i, o) in list.iter().enumerate() {
        let at = format!("override[{i}].");
        let net = o.net;
        override_net(net, v4, v6).map_err(|why| bad(format!("{at}cidr"), why))?;
        if !seen.insert(net) {
            return Err(bad(format!("{at}cidr"), format!("{net} is listed twice")));
        }
        let code = match o.action {
            OverrideAction::Allow => resolution::ALLOW,
            OverrideAction::Deny => resolution::DENY,
            OverrideAction::Limit(l) => {
                out.limits.push(l.to_kernel(&at)?);
                u32::try_from(out.limits.len()).expect("bounded by MAX_OVERRIDES")
            }
        };
        let plen = u32::from(net.prefix_len());
        match net {
            IpNet::V4(n) => out.v4.push((plen, u32::from_ne_bytes(n.addr().octets()), code)),
            IpNet::V6(n) => {
                let o = n.addr().octets();
                let words =
                    std::array::from_fn(|w| u32::from_ne_bytes([o[w * 4], o[w * 4 + 1], o[w * 4 + 2], o[w * 4 + 3]]));
                out.v6.push((plen, words, code));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
