//! The one place a policy is validated and turned into the kernel's form:
//! [`Policy::compile`] returns the `Config` and the override entries
//! together, or the path of the first bad field (invariant 6). The daemon
//! calls it once per apply; nothing touches the kernel before it succeeds.

use std::collections::HashSet;

use ipnet::IpNet;
use limiter_common::{
    ClassLimits, Config, MAX_CLASSES, MAX_MATCHERS, MAX_V6_BUCKET_PREFIX, Matcher, flags, gcra,
    maps::{MAX_BUCKET_CAPACITY, MAX_OVERRIDES},
    resolution,
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
            feedback,
            feeds,
            crowdsec,
            fleet,
            // Only a reload reads it (the daemon's guard).
            allow_shrink: _,
            // The daemon reads it against the kernel it runs on.
            missing_kernel_feature: _,
        } = self;
        super::forward::check(forwards)?;
        if let Some(f) = fleet {
            super::fleet::check(f)?;
        }
        if let Some(f) = feedback {
            super::feedback::check(f)?;
        }
        super::feed::check(feeds)?;
        if let Some(c) = crowdsec {
            super::crowdsec::check(c)?;
        }
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
        let overrides = compile_overrides(overrides, *v4_prefix, *v6_prefix)?;
        Ok(Compiled { config, overrides })
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
        if !c.ports.is_empty() && !matches!(c.protocol, super::Protocol::Tcp | super::Protocol::Udp) {
            return Err(bad(format!("{at}ports"), "ports need protocol = \"tcp\" or \"udp\""));
        }
        config.classes[i + 1] = c.limit.to_kernel(&at)?;
        let ranges: &[(u16, u16)] = if c.ports.is_empty() { &[(0, u16::MAX)] } else { &c.ports };
        for &(lo, hi) in ranges {
            if lo > hi {
                return Err(bad(format!("{at}ports"), format!("range {lo}-{hi} is empty")));
            }
            let Some(m) = config.matchers.get_mut(n) else {
                return Err(bad(format!("{at}ports"), format!("more than {MAX_MATCHERS} port ranges in all classes")));
            };
            let class = u8::try_from(i + 1).expect("fewer than MAX_CLASSES");
            *m = Matcher { proto, syn: u8::from(c.syn), class, pad: 0, port_lo: lo, port_hi: hi };
            n += 1;
        }
    }
    config.n_matchers = u32::try_from(n).expect("bounded by MAX_MATCHERS");
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
        if net.trunc() != net {
            return Err(bad(format!("{at}cidr"), format!("{net} has host bits set (did you mean {}?)", net.trunc())));
        }
        let bucket = if net.addr().is_ipv4() { v4 } else { v6 };
        if u32::from(net.prefix_len()) > bucket {
            return Err(bad(
                format!("{at}cidr"),
                format!("{net} is longer than the bucket prefix /{bucket}: an override covers whole buckets"),
            ));
        }
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
mod tests {
    use limiter_common::mode;

    use super::*;
    use crate::policy::{Class, Protocol, tests::https_syn};

    fn ovr(cidr: &str, action: OverrideAction) -> Policy {
        Policy {
            overrides: vec![Override { net: cidr.parse().unwrap(), action, criticality: None }],
            ..Policy::default()
        }
    }

    #[test]
    fn overrides_compile_to_trie_entries_and_limits() {
        let lim = Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce, window: None };
        let p = Policy {
            overrides: vec![
                Override {
                    net: "198.18.0.0/16".parse().unwrap(),
                    action: OverrideAction::Limit(lim),
                    criticality: None,
                },
                Override { net: "198.18.5.0/24".parse().unwrap(), action: OverrideAction::Allow, criticality: None },
                Override { net: "2001:2::/48".parse().unwrap(), action: OverrideAction::Deny, criticality: None },
            ],
            ..Policy::default()
        };
        let c = p.compile(1).unwrap().overrides;
        assert_eq!(
            c.v4,
            vec![(16, u32::from_ne_bytes([198, 18, 0, 0]), 1), (24, u32::from_ne_bytes([198, 18, 5, 0]), u32::MAX)]
        );
        assert_eq!(c.v6.len(), 1);
        assert_eq!(c.v6[0].2, u32::MAX - 1);
        assert_eq!(c.limits, vec![lim.to_kernel("").unwrap()]);
        let dup = Policy { overrides: vec![p.overrides[1], p.overrides[1]], ..Policy::default() };
        assert!(dup.compile(1).unwrap_err().problem.contains("twice"));
    }

    #[test]
    fn default_policy_is_valid() {
        let c = Policy::default().compile(1).unwrap().config;
        // 1 ms per packet and 2 s of burst, in 1/16 ns.
        assert_eq!(c.classes[0].unit, 16_000_000);
        assert_eq!(c.classes[0].tau, 32_000_000_000);
        assert_eq!((c.version, c.n_matchers, c.flags), (1, 0, flags::CONFIGURED));
    }

    #[test]
    fn classes_compile_to_one_matcher_per_port_range() {
        let p = Policy { classes: vec![https_syn()], ..Policy::default() };
        let c = p.compile(7).unwrap().config;
        assert_eq!(c.n_matchers, 2);
        assert_eq!((c.matchers[0].port_lo, c.matchers[1].port_lo), (443, 8443));
        assert!(c.matchers[..2].iter().all(|m| m.class == 1 && m.syn == 1 && m.proto == 6));
        assert_eq!(c.classes[1].mode, mode::SHADOW);
        assert_eq!(p.class_names(), ["default", "https-syn"]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let d = Policy::default();
        let lim = d.default;
        let with_class = |f: fn(&mut Class)| {
            let mut c = https_syn();
            f(&mut c);
            Policy { classes: vec![c], ..d.clone() }
        };
        let cases = [
            (Policy { default: Limit { rate: 0, ..lim }, ..d.clone() }, "rate"),
            (Policy { default: Limit { burst: 0, ..lim }, ..d.clone() }, "burst"),
            (Policy { default: Limit { cost: CostUnit::Bytes, burst: 1000, ..lim }, ..d.clone() }, "burst"),
            (Policy { default: Limit { burst: u64::MAX / 2, ..lim }, ..d.clone() }, "burst"),
            (Policy { v4_prefix: 33, ..d.clone() }, "v4_prefix"),
            (Policy { v6_prefix: 65, ..d.clone() }, "v6_prefix"),
            (Policy { capacity: 0, ..d.clone() }, "capacity"),
            (Policy { capacity: u32::MAX, ..d.clone() }, "capacity"),
            (with_class(|c| c.limit.rate = 0), "class[0].rate"),
            (with_class(|c| c.protocol = Protocol::Udp), "class[0].syn"),
            (with_class(|c| c.name.clear()), "class[0].name"),
            (with_class(|c| c.ports = vec![(9, 3)]), "class[0].ports"),
            (with_class(|c| c.ports = (1..=17).map(|p| (p, p)).collect()), "class[0].ports"),
            (Policy { classes: vec![https_syn(); 8], ..d.clone() }, "class"),
            (Policy { classes: vec![https_syn(), https_syn()], ..d }, "class[1].name"),
            (ovr("198.18.5.1/24", OverrideAction::Allow), "override[0].cidr"),
            (ovr("198.18.5.0/25", OverrideAction::Allow), "override[0].cidr"),
            (ovr("2001:2::/64", OverrideAction::Deny), "override[0].cidr"),
            (ovr("198.18.0.0/16", OverrideAction::Limit(Limit { rate: 0, ..lim })), "override[0].rate"),
        ];
        for (p, field) in cases {
            assert_eq!(p.compile(1).unwrap_err().field, field, "{p:?}");
        }
    }
}
