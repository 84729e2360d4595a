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
            fleet,
        } = self;
        super::forward::check(forwards)?;
        if let Some(f) = fleet {
            super::fleet::check(f)?;
        }
        if let Some(f) = feedback {
            super::feedback::check(f)?;
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
        compile_cookies(classes, new_sources.map(|(rate, _)| rate), &mut config)?;
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

/// MSS a SYN cookie's SYN-ACK advertises over IPv4 and IPv6: an
/// Ethernet MTU of 1500 less the IP and TCP headers.
pub const COOKIE_MSS: (u16, u16) = (1460, 1440);

/// SYN cookies of each class: only for classes of new TCP connections to
/// named ports (an ACK is checked against the class its SYN would be in,
/// so a class that matched any port would check the replies to this
/// host's own outgoing connections), and only where a SYN may be refused
/// at all (not in shadow mode).
fn compile_cookies(classes: &[super::Class], new_rate: Option<u64>, config: &mut Config) -> Result<(), PolicyError> {
    use super::SynCookies;
    use limiter_common::cookie::{PERIOD, mode};
    config.cookies.mss4 = COOKIE_MSS.0;
    config.cookies.mss6 = COOKIE_MSS.1;
    for (i, c) in classes.iter().enumerate() {
        let at = format!("class[{i}].");
        if c.syn_rate.is_some() && c.syn_cookies != SynCookies::Auto {
            return Err(bad(format!("{at}syn_rate"), "belongs to syn_cookies = \"auto\""));
        }
        if c.syn_cookies == SynCookies::Off {
            continue;
        }
        if c.protocol != super::Protocol::Tcp || !c.syn || c.ports.is_empty() {
            return Err(bad(
                format!("{at}syn_cookies"),
                "needs protocol = \"tcp\", syn = true and the listening ports",
            ));
        }
        if c.limit.mode == Mode::Shadow {
            return Err(bad(format!("{at}syn_cookies"), "a class in shadow mode refuses nothing to answer for"));
        }
        config.cookies.mode[i + 1] = match c.syn_cookies {
            SynCookies::Off => mode::OFF,
            SynCookies::Auto => mode::AUTO,
            SynCookies::Always => mode::ALWAYS,
        };
        if c.syn_cookies == SynCookies::Auto {
            let Some(rate) = c.syn_rate.or(new_rate) else {
                return Err(bad(
                    format!("{at}syn_rate"),
                    "syn_cookies = \"auto\" without a new-source budget needs syn_rate",
                ));
            };
            if !(1..=gcra::MAX_RATE).contains(&rate) {
                return Err(bad(format!("{at}syn_rate"), format!("{rate} is outside 1..={}", gcra::MAX_RATE)));
            }
            // SYNs per counting period: rate x PERIOD (1/16 ns), at least one.
            let per = (u128::from(rate) * u128::from(PERIOD) / u128::from(gcra::to_fixed(gcra::NS_PER_S))).max(1);
            config.cookies.per_period[i + 1] = u32::try_from(per).unwrap_or(u32::MAX);
        }
        config.flags |= flags::SYN_COOKIES;
    }
    cookie_ranges(config)
}

/// The ports whose SYNs land in a class with cookies on (first matcher
/// wins, as in the program), as the ranges the program checks ACKs with.
fn cookie_ranges(config: &mut Config) -> Result<(), PolicyError> {
    use limiter_common::{
        cookie::{MAX_RANGES, mode},
        packet::{IPPROTO_TCP, Source},
        rules::classify,
    };
    let mut ranges: Vec<(u16, u16, usize)> = Vec::new();
    for port in 0..=u16::MAX {
        let src = Source { proto: IPPROTO_TCP, port_known: 1, syn: 1, dport: port, ..Source::default() };
        let class = classify(config, &src);
        if config.cookies.mode[class] == mode::OFF {
            continue;
        }
        match ranges.last_mut() {
            Some((_, hi, c)) if *c == class && u32::from(*hi) + 1 == u32::from(port) => *hi = port,
            _ => ranges.push((port, port, class)),
        }
    }
    if ranges.len() > MAX_RANGES {
        return Err(bad(
            "class",
            format!(
                "the ports of classes with syn_cookies split into {} ranges, at most {MAX_RANGES} fit",
                ranges.len()
            ),
        ));
    }
    for (i, (lo, hi, class)) in ranges.into_iter().enumerate() {
        config.cookies.lo[i] = lo;
        config.cookies.hi[i] = hi;
        config.cookies.class[i] = u8::try_from(class).expect("fewer than MAX_CLASSES");
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
    use crate::policy::{Class, Protocol, SynCookies};

    fn https_syn() -> Class {
        Class {
            name: "https-syn".into(),
            protocol: Protocol::Tcp,
            ports: vec![(443, 443), (8443, 8443)],
            syn: true,
            limit: Limit { rate: 20, burst: 40, cost: CostUnit::Packets, mode: Mode::Shadow, window: None },
            syn_cookies: SynCookies::Off,
            syn_rate: None,
        }
    }

    fn ovr(cidr: &str, action: OverrideAction) -> Policy {
        Policy { overrides: vec![Override { net: cidr.parse().unwrap(), action }], ..Policy::default() }
    }

    #[test]
    fn overrides_compile_to_trie_entries_and_limits() {
        let lim = Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce, window: None };
        let p = Policy {
            overrides: vec![
                Override { net: "198.18.0.0/16".parse().unwrap(), action: OverrideAction::Limit(lim) },
                Override { net: "198.18.5.0/24".parse().unwrap(), action: OverrideAction::Allow },
                Override { net: "2001:2::/48".parse().unwrap(), action: OverrideAction::Deny },
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
    fn syn_cookies_are_for_enforced_classes_of_new_connections_to_named_ports() {
        let with = |f: fn(&mut Class)| {
            let mut c = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
            c.syn_cookies = SynCookies::Auto;
            f(&mut c);
            Policy { classes: vec![c], ..Policy::default() }.compile(1)
        };
        let field = |r: Result<Compiled, PolicyError>| r.unwrap_err().field;
        assert_eq!(field(with(|c| c.syn = false)), "class[0].syn_cookies");
        assert_eq!(field(with(|c| c.ports.clear())), "class[0].syn_cookies");
        assert_eq!(field(with(|c| c.limit.mode = Mode::Shadow)), "class[0].syn_cookies");
        assert_eq!(field(with(|c| (c.syn_cookies, c.syn_rate) = (SynCookies::Always, Some(5)))), "class[0].syn_rate");
        let p = Policy { new_sources: None, ..Policy::default() };
        let mut c = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
        c.syn_cookies = SynCookies::Auto;
        let e = Policy { classes: vec![c.clone()], ..p.clone() }.compile(1).unwrap_err();
        assert_eq!(e.field, "class[0].syn_rate", "auto needs a rate when there is no budget: {e}");
        // 2,000 SYNs/s: 500 per 250 ms period; the budget's rate otherwise.
        c.syn_rate = Some(2_000);
        let k = Policy { classes: vec![c.clone()], ..p }.compile(1).unwrap().config;
        assert_eq!((k.cookies.mode[1], k.cookies.per_period[1]), (limiter_common::cookie::mode::AUTO, 500));
        assert_ne!(k.flags & flags::SYN_COOKIES, 0);
        c.syn_rate = None;
        let k = Policy { classes: vec![c], ..Policy::default() }.compile(1).unwrap().config;
        assert_eq!(k.cookies.per_period[1], 5_000 / 4);
    }

    #[test]
    fn cookie_port_ranges_follow_the_first_matching_class() {
        let mut cookies = Class { limit: Limit { mode: Mode::Enforce, ..https_syn().limit }, ..https_syn() };
        cookies.syn_cookies = SynCookies::Always;
        cookies.ports = vec![(8000, 8999)];
        // An earlier class takes the SYNs to 8443: they are not the cookie class's.
        let earlier = Class { name: "alt".into(), ports: vec![(8443, 8443)], ..cookies.clone() };
        let earlier = Class { syn_cookies: SynCookies::Off, ..earlier };
        let k = Policy { classes: vec![earlier, cookies.clone()], ..Policy::default() }.compile(1).unwrap().config;
        let ranges: Vec<(u16, u16, u8)> = (0..limiter_common::cookie::MAX_RANGES)
            .map(|i| (k.cookies.lo[i], k.cookies.hi[i], k.cookies.class[i]))
            .collect();
        assert_eq!(ranges[..3], [(8000, 8442, 2), (8444, 8999, 2), (0, 0, 0)]);
        assert_eq!(k.cookies.class_of(8442), Some(2));
        assert_eq!(k.cookies.class_of(8443), None);
        // Nine separate ranges do not fit.
        cookies.ports = (0..9).map(|i| (1000 + 10 * i, 1000 + 10 * i)).collect();
        let e = Policy { classes: vec![cookies], ..Policy::default() }.compile(1).unwrap_err();
        assert!(e.problem.contains("9 ranges"), "{e}");
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
