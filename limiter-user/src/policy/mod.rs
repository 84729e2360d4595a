//! The policy the data plane enforces: its model, validation, compilation
//! into the kernel's `Config`, and the built-in default that applies when
//! no policy file exists. `file` reads the TOML form.

pub mod file;
pub mod runtime;

use limiter_common::{
    ClassLimits, Config, MAX_CLASSES, MAX_MATCHERS, MAX_V6_BUCKET_PREFIX, Matcher, cost, flags, mode,
};

/// Default location of the policy file.
pub const DEFAULT_PATH: &str = "/etc/limiter/limiter.toml";
/// Smallest byte burst: a bucket must hold one full-size Ethernet frame.
pub const MIN_BYTE_BURST: u64 = 1_518;

/// What one admitted packet costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CostUnit {
    /// One unit per packet.
    Packets,
    /// The frame length in bytes.
    Bytes,
}

impl CostUnit {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Packets => "packets",
            Self::Bytes => "bytes",
        }
    }

    /// The data plane's [`cost`] code.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::Packets => cost::PACKETS,
            Self::Bytes => cost::BYTES,
        }
    }

    /// Back from [`CostUnit::code`]; `None` for a code this build lacks.
    #[must_use]
    pub fn from_code(code: u32) -> Option<Self> {
        [Self::Packets, Self::Bytes].into_iter().find(|c| c.code() == code)
    }
}

/// Whether a class drops what exceeds its allowance or only counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Enforce,
    /// Pass would-be drops, counted as `shadow_dropped`.
    Shadow,
}

impl Mode {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
        }
    }

    /// The data plane's [`mode`] code.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::Enforce => mode::ENFORCE,
            Self::Shadow => mode::SHADOW,
        }
    }

    /// Back from [`Mode::code`]; `None` for a code this build lacks.
    #[must_use]
    pub fn from_code(code: u32) -> Option<Self> {
        [Self::Enforce, Self::Shadow].into_iter().find(|m| m.code() == code)
    }
}

/// Rate, depth, cost unit and mode of one bucket class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Units per second per prefix.
    pub rate: u64,
    /// Bucket depth in units.
    pub burst: u64,
    pub cost: CostUnit,
    pub mode: Mode,
}

/// A rule class: packets it matches get buckets and limits of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    /// IP protocol number; 0 = any.
    pub protocol: u8,
    /// Destination port ranges (inclusive); empty = any port.
    pub ports: Vec<(u16, u16)>,
    /// Only TCP SYN without ACK (new connections).
    pub syn: bool,
    pub limit: Limit,
}

/// What an override does to the prefixes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideAction {
    /// Own limits for the default class of each bucket it covers.
    Limit(Limit),
    /// Never limited, in any class.
    Allow,
    /// Always dropped, in any class.
    Deny,
}

/// A per-prefix override. The most specific one containing a bucket's
/// prefix applies. It may not be longer than the bucket prefix length of
/// its family: overrides act on whole buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    pub net: ipnet::IpNet,
    pub action: OverrideAction,
}

/// The aggregate tier: a coarser prefix charged together with the fine
/// one, so rotating addresses inside one network does not multiply its
/// allowance. Applies to the default class, in its cost unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aggregate {
    pub rate: u64,
    pub burst: u64,
    /// Default 16; at most the IPv4 bucket prefix length.
    pub v4_prefix: u32,
    /// Default 40; at most the IPv6 bucket prefix length.
    pub v6_prefix: u32,
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

/// Default new-source budget: 5,000 new prefixes a second, burst 10,000.
///
/// On by default: without it every spoofed source is a new key with a
/// fresh allowance, so a random-source flood passes whole and churns the
/// LRU at several hundred ns a packet. A host's steady rate of prefixes
/// it has not seen recently is far below 5,000 a second, and the burst
/// absorbs a flash crowd; during a spoofed flood, new legitimate prefixes
/// compete with the flood for the budget while prefixes that already have
/// a bucket are not affected. `new_source_rate = 0` turns it off.
pub const DEFAULT_NEW_SOURCES: (u64, u64) = (5_000, 10_000);

/// A complete policy. [`Policy::default`] is the built-in one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Limits of the default class (everything no class matches).
    pub default: Limit,
    pub classes: Vec<Class>,
    pub overrides: Vec<Override>,
    /// Shared budget of new prefixes: (rate per second, burst); `None` =
    /// unlimited. Packets of prefixes without a bucket beyond it are
    /// dropped as `new_source_limited`, without creating a bucket. On by
    /// default ([`DEFAULT_NEW_SOURCES`]).
    pub new_sources: Option<(u64, u64)>,
    /// Off when `None`.
    pub aggregate: Option<Aggregate>,
    pub v4_prefix: u32,
    pub v6_prefix: u32,
    /// Tracked prefixes (LRU capacity of the bucket map).
    pub capacity: u32,
}

impl Default for Policy {
    /// 1,000 packets/s with a burst of 2,000 per IPv4 /24 and IPv6 /56,
    /// enforced, 262,144 tracked prefixes: generous for any one
    /// well-behaved network in front of a TLS edge, far below a flood.
    /// New prefixes: 5,000 a second, burst 10,000, shared.
    fn default() -> Self {
        Self {
            default: Limit { rate: 1_000, burst: 2_000, cost: CostUnit::Packets, mode: Mode::Enforce },
            classes: Vec::new(),
            overrides: Vec::new(),
            new_sources: Some(DEFAULT_NEW_SOURCES),
            aggregate: None,
            v4_prefix: 24,
            v6_prefix: 56,
            capacity: limiter_common::maps::DEFAULT_BUCKET_CAPACITY,
        }
    }
}

/// Why a policy was refused: the path of the offending field, the problem,
/// and where in which file when it came from one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}{field}: {problem}", location.as_ref().map(|(f, l)| format!("{f}:{l}: ")).unwrap_or_default())]
pub struct PolicyError {
    /// Dotted path, e.g. `class[2].rate`.
    pub field: String,
    pub problem: String,
    /// File and 1-based line.
    pub location: Option<(String, usize)>,
}

pub(crate) fn bad(field: impl Into<String>, problem: impl Into<String>) -> PolicyError {
    PolicyError { field: field.into(), problem: problem.into(), location: None }
}

impl Limit {
    /// Check the limit and derive the kernel's form. `at` prefixes field names.
    pub fn to_kernel(&self, at: &str) -> Result<ClassLimits, PolicyError> {
        let Self { rate, burst, cost, mode } = *self;
        if !(1..=limiter_common::gcra::MAX_RATE).contains(&rate) {
            return Err(bad(format!("{at}rate"), format!("{rate} is outside 1..={}", limiter_common::gcra::MAX_RATE)));
        }
        let min_burst = match cost {
            CostUnit::Packets => 1,
            CostUnit::Bytes => MIN_BYTE_BURST,
        };
        if burst < min_burst {
            let unit = cost.label();
            return Err(bad(
                format!("{at}burst"),
                format!("{burst} is below {min_burst}, the least a bucket of {unit} must hold"),
            ));
        }
        ClassLimits::new(rate, burst, cost.code(), mode.code())
            .ok_or_else(|| bad(format!("{at}burst"), format!("{burst} is too large for rate {rate}")))
    }
}

impl Policy {
    /// Check every field and derive the data-plane config, stamped `version`.
    pub fn compile(&self, version: u64) -> Result<Config, PolicyError> {
        let Self { default, classes, overrides, new_sources, aggregate, v4_prefix, v6_prefix, capacity } = self;
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
        if *capacity == 0 {
            return Err(bad("capacity", "must be at least 1"));
        }
        if classes.len() > MAX_CLASSES - 1 {
            return Err(bad("class", format!("{} classes, at most {} fit", classes.len(), MAX_CLASSES - 1)));
        }
        let mut cfg = Config {
            version,
            v4_prefix: *v4_prefix,
            v6_prefix: *v6_prefix,
            flags: flags::CONFIGURED,
            drop_sample: crate::top::DROP_SAMPLE,
            ..Config::default()
        };
        cfg.classes[0] = default.to_kernel("")?;
        if let Some(a) = aggregate {
            if a.v4_prefix > *v4_prefix {
                return Err(bad(
                    "aggregate_v4_prefix",
                    format!("/{} is finer than the bucket prefix /{v4_prefix}", a.v4_prefix),
                ));
            }
            if a.v6_prefix > *v6_prefix {
                return Err(bad(
                    "aggregate_v6_prefix",
                    format!("/{} is finer than the bucket prefix /{v6_prefix}", a.v6_prefix),
                ));
            }
            let k = Limit { rate: a.rate, burst: a.burst, cost: default.cost, mode: Mode::Enforce }
                .to_kernel("aggregate_")?;
            (cfg.agg_unit, cfg.agg_tau, cfg.agg_v4_prefix, cfg.agg_v6_prefix) =
                (k.unit, k.tau, a.v4_prefix, a.v6_prefix);
        }
        if let Some((rate, burst)) = *new_sources {
            let budget = Limit { rate, burst, cost: CostUnit::Packets, mode: Mode::Enforce };
            let k = budget.to_kernel("new_source_")?;
            (cfg.new_unit, cfg.new_tau) = (k.unit, k.tau);
        }
        let mut n = 0;
        for (i, c) in classes.iter().enumerate() {
            let at = format!("class[{i}].");
            if c.name.is_empty() || classes[..i].iter().any(|o| o.name == c.name) {
                return Err(bad(format!("{at}name"), format!("{:?} is empty or used twice", c.name)));
            }
            if c.syn && c.protocol != 6 {
                return Err(bad(format!("{at}syn"), "syn = true needs protocol = \"tcp\""));
            }
            if !c.ports.is_empty() && c.protocol != 6 && c.protocol != 17 {
                return Err(bad(format!("{at}ports"), "ports need protocol = \"tcp\" or \"udp\""));
            }
            cfg.classes[i + 1] = c.limit.to_kernel(&at)?;
            let ranges: &[(u16, u16)] = if c.ports.is_empty() { &[(0, u16::MAX)] } else { &c.ports };
            for &(lo, hi) in ranges {
                if lo > hi {
                    return Err(bad(format!("{at}ports"), format!("range {lo}-{hi} is empty")));
                }
                let Some(m) = cfg.matchers.get_mut(n) else {
                    return Err(bad(
                        format!("{at}ports"),
                        format!("more than {MAX_MATCHERS} port ranges in all classes"),
                    ));
                };
                let class = u8::try_from(i + 1).expect("fewer than MAX_CLASSES");
                *m = Matcher { proto: c.protocol, syn: u8::from(c.syn), class, pad: 0, port_lo: lo, port_hi: hi };
                n += 1;
            }
        }
        cfg.n_matchers = u32::try_from(n).expect("bounded by MAX_MATCHERS");
        compile_overrides(overrides, *default, *v4_prefix, *v6_prefix)?;
        Ok(cfg)
    }

    /// The overrides in kernel form (validated as by [`Policy::compile`]).
    pub fn compile_overrides(&self) -> Result<CompiledOverrides, PolicyError> {
        compile_overrides(&self.overrides, self.default, self.v4_prefix, self.v6_prefix)
    }

    /// Names of the classes by index (0 = `default`).
    #[must_use]
    pub fn class_names(&self) -> Vec<&str> {
        std::iter::once("default").chain(self.classes.iter().map(|c| c.name.as_str())).collect()
    }
}

fn compile_overrides(list: &[Override], default: Limit, v4: u32, v6: u32) -> Result<CompiledOverrides, PolicyError> {
    use ipnet::IpNet;
    use limiter_common::{maps::MAX_OVERRIDES, resolution};

    if list.len() > MAX_OVERRIDES as usize {
        return Err(bad("override", format!("{} overrides, at most {MAX_OVERRIDES} fit", list.len())));
    }
    let mut out = CompiledOverrides::default();
    let mut seen = std::collections::HashSet::new();
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
                let _ = default;
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
    use super::*;

    fn https_syn() -> Class {
        Class {
            name: "https-syn".into(),
            protocol: 6,
            ports: vec![(443, 443), (8443, 8443)],
            syn: true,
            limit: Limit { rate: 20, burst: 40, cost: CostUnit::Packets, mode: Mode::Shadow },
        }
    }

    fn ovr(cidr: &str, action: OverrideAction) -> Policy {
        Policy { overrides: vec![Override { net: cidr.parse().unwrap(), action }], ..Policy::default() }
    }

    #[test]
    fn overrides_compile_to_trie_entries_and_limits() {
        let lim = Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce };
        let p = Policy {
            overrides: vec![
                Override { net: "198.18.0.0/16".parse().unwrap(), action: OverrideAction::Limit(lim) },
                Override { net: "198.18.5.0/24".parse().unwrap(), action: OverrideAction::Allow },
                Override { net: "2001:2::/48".parse().unwrap(), action: OverrideAction::Deny },
            ],
            ..Policy::default()
        };
        let c = p.compile_overrides().unwrap();
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
        let c = Policy::default().compile(1).unwrap();
        // 1 ms per packet and 2 s of burst, in 1/16 ns.
        assert_eq!(c.classes[0].unit, 16_000_000);
        assert_eq!(c.classes[0].tau, 32_000_000_000);
        assert_eq!((c.version, c.n_matchers, c.flags), (1, 0, flags::CONFIGURED));
    }

    #[test]
    fn classes_compile_to_one_matcher_per_port_range() {
        let p = Policy { classes: vec![https_syn()], ..Policy::default() };
        let c = p.compile(7).unwrap();
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
            (with_class(|c| c.limit.rate = 0), "class[0].rate"),
            (with_class(|c| c.protocol = 17), "class[0].syn"),
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
