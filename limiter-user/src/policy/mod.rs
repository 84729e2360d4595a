//! The policy the data plane enforces: its model with every default, the
//! TOML file (`file`), its top-level settings, which `limiter run`'s flags
//! are too (`knobs`), the command-line overlay (`overlay`), the one
//! compilation into the kernel's form (`compile`), and the encoding of
//! runtime overrides in the pinned `RUNTIME` map (`runtime`).

pub mod attacks;
pub mod compile;
mod cookies;
mod criticality;
pub mod crowdsec;
pub(crate) mod duration;
pub(crate) mod error;
pub mod feed;
pub mod feedback;
pub mod file;
pub mod fleet;
pub mod forward;
pub mod kernel;
pub mod knobs;
pub mod overlay;
pub mod runtime;
mod summary;
mod tcp_state;
pub mod upstream;
pub mod words;

use std::{
    fmt,
    path::{Path, PathBuf},
};

use clap::ValueEnum;
use limiter_common::{cost, mode, packet};
use serde::{Deserialize, Serialize};

pub use self::criticality::Criticality;
pub(crate) use self::duration::{duration, duration_opt, duration_opt_out, duration_out};
pub use self::error::PolicyError;
pub(crate) use self::error::bad;
pub use self::words::Action;
pub use self::{
    compile::{Compiled, CompiledOverrides},
    duration::{DurationError, parse_duration, spell_duration},
    file::{Loaded, Provenance},
    knobs::Knobs,
    overlay::Overlay,
    summary::Summary,
};

/// Default location of the policy file.
pub const DEFAULT_PATH: &str = "/etc/limiter/limiter.toml";
/// Smallest byte burst: a bucket must hold one full-size Ethernet frame.
pub const MIN_BYTE_BURST: u64 = 1_518;
/// Default new-source budget: 5,000 new prefixes a second, burst 10,000.
/// On by default: without it every spoofed source is a new key with a
/// fresh allowance, so a random-source flood passes whole and churns the
/// LRU at several hundred ns a packet. A host's steady rate of prefixes
/// it has not seen recently is far below 5,000 a second, and the burst
/// absorbs a flash crowd (new legitimate prefixes compete with a spoofed
/// flood for it; prefixes with a bucket are not affected).
pub const DEFAULT_NEW_SOURCES: (u64, u64) = (5_000, 10_000);
/// Default aggregate prefix lengths (IPv4, IPv6) when the tier is on.
pub const DEFAULT_AGGREGATE_PREFIXES: (u32, u32) = (16, 40);

/// The policy file in force: `given`, else [`DEFAULT_PATH`] if a file is there, else none (built-in).
#[must_use]
pub fn resolve_path(given: Option<&Path>) -> Option<PathBuf> {
    given.map(Path::to_path_buf).or_else(|| Path::new(DEFAULT_PATH).is_file().then(|| DEFAULT_PATH.into()))
}

/// An enum value's name as the file and the command line spell it (serde's and clap's one table).
fn name_of<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_owned())
}

/// The name serde gives a unit variant (the one spelling of the file).
#[must_use]
pub fn spelling(v: &impl Serialize) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// What one admitted packet costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CostUnit {
    /// One unit per packet.
    Packets,
    /// The frame length in bytes.
    Bytes,
}

/// Whether a class drops what exceeds its allowance or only counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Enforce,
    /// Pass would-be drops, counted as `shadow_dropped`.
    Shadow,
}

/// When a TCP class answers SYNs from sources without a bucket with SYN
/// cookies from XDP (see docs/syn-cookies.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SynCookies {
    #[default]
    Off,
    /// While the class is under a SYN flood: `syn_rate` SYNs/s from
    /// sources without a bucket (default: the new-source budget's rate),
    /// or the new-source budget refusing one of its SYNs.
    Auto,
    Always,
}

/// Whether a class drops TCP segments no connection of this host holds
/// (docs/tcp-state.md): never, while such segments are seen, or always.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TcpState {
    Off,
    /// While out-of-state segments to the class's listeners are seen
    /// (1,000 a second, estimated from one segment in 64), and 10 s after.
    #[default]
    Auto,
    Always,
}

/// The IP protocol a class matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Any,
    Icmp,
    Tcp,
    Udp,
    Icmpv6,
}

macro_rules! display_by_name {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&name_of(self))
            }
        }
    )*};
}
display_by_name!(CostUnit, Mode, Protocol, TcpState);

impl From<CostUnit> for u32 {
    fn from(c: CostUnit) -> u32 {
        match c {
            CostUnit::Packets => cost::PACKETS,
            CostUnit::Bytes => cost::BYTES,
        }
    }
}

impl TryFrom<u32> for CostUnit {
    type Error = u32;
    /// Back from the kernel's code; `Err` for a code this build lacks.
    fn try_from(code: u32) -> Result<Self, u32> {
        [Self::Packets, Self::Bytes].into_iter().find(|c| u32::from(*c) == code).ok_or(code)
    }
}

impl From<Mode> for u32 {
    fn from(m: Mode) -> u32 {
        match m {
            Mode::Enforce => mode::ENFORCE,
            Mode::Shadow => mode::SHADOW,
        }
    }
}

impl TryFrom<u32> for Mode {
    type Error = u32;
    fn try_from(code: u32) -> Result<Self, u32> {
        [Self::Enforce, Self::Shadow].into_iter().find(|m| u32::from(*m) == code).ok_or(code)
    }
}

impl From<Protocol> for u8 {
    /// The IP protocol number; 0 = any.
    fn from(p: Protocol) -> u8 {
        match p {
            Protocol::Any => 0,
            Protocol::Icmp => packet::IPPROTO_ICMP,
            Protocol::Tcp => packet::IPPROTO_TCP,
            Protocol::Udp => packet::IPPROTO_UDP,
            Protocol::Icmpv6 => packet::IPPROTO_ICMPV6,
        }
    }
}

/// Rate, depth, cost unit and mode of one bucket class; or, with
/// `window`, a window quota (then `rate` and `burst` are 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Units per second per prefix.
    pub rate: u64,
    /// Bucket depth in units.
    pub burst: u64,
    pub cost: CostUnit,
    pub mode: Mode,
    pub window: Option<Window>,
}

/// Where a window quota is counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// On this host only.
    #[default]
    Local,
    /// Across the fleet, through the store of `[fleet]`.
    Fleet,
}

/// What a fleet-scope quota does while the store is unreachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreFailure {
    /// Decide on the last known view plus local counts: no refusal caused
    /// by the outage; overshoot up to the node count during it.
    #[default]
    Open,
    /// Admit only `limit / nodes` locally: bounded overshoot, but a
    /// compliant client may be refused.
    Split,
}

/// A window quota: at most `limit` units per `length`, in `slices`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub limit: u64,
    pub length: std::time::Duration,
    pub slices: u32,
    pub scope: Scope,
    pub on_store_failure: StoreFailure,
}

/// Default slices of a window (the case study's 12 of 5 s in 60 s).
pub const DEFAULT_SLICES: u32 = 12;

/// A rule class: packets it matches get buckets and limits of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    pub protocol: Protocol,
    /// Destination port ranges (inclusive; empty = any port), or source
    /// port ranges (a reflection class: DNS answers from 53), not both.
    pub ports: Vec<(u16, u16)>,
    pub source_ports: Vec<(u16, u16)>,
    /// Only TCP SYN without ACK (new connections).
    pub syn: bool,
    pub limit: Limit,
    pub syn_cookies: SynCookies,
    /// `auto` engages above this many SYNs/s from sources without a bucket.
    pub syn_rate: Option<u64>,
    /// Out-of-state TCP; `None`: `auto` where the class takes TCP
    /// segments other than SYNs, `off` elsewhere.
    pub tcp_state: Option<TcpState>,
    /// The forwarder's rank of its connections ([`Criticality`]).
    pub criticality: Criticality,
}

impl PartialEq<&str> for Action {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What an override does to the prefixes it covers: its [`Action`] with
/// the limits a `limit` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideAction {
    /// Own limits for the default class of each bucket it covers.
    Limit(Limit),
    /// Never limited, in any class.
    Allow,
    /// Always dropped, in any class.
    Deny,
}

impl OverrideAction {
    /// Its word.
    #[must_use]
    pub const fn action(&self) -> Action {
        match self {
            OverrideAction::Limit(_) => Action::Limit,
            OverrideAction::Allow => Action::Allow,
            OverrideAction::Deny => Action::Deny,
        }
    }

    /// An `allow` or a `deny` (`None` for another word: those take limits).
    #[must_use]
    pub const fn of(action: Action) -> Option<Self> {
        match action {
            Action::Allow => Some(OverrideAction::Allow),
            Action::Deny => Some(OverrideAction::Deny),
            _ => None,
        }
    }
}

/// A per-prefix override. The most specific one containing a bucket's
/// prefix applies. It may not be longer than the bucket prefix length of
/// its family: overrides act on whole buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    pub net: ipnet::IpNet,
    pub action: OverrideAction,
    /// The forwarder's rank for its connections (`None`: critical when
    /// allowed, else the class's).
    pub criticality: Option<Criticality>,
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
    /// Forwarders to the tenant layer (none by default).
    pub forwards: Vec<forward::Forward>,
    /// Destinations forwarded at the driver (none by default).
    pub tunnels: Vec<crate::tunnel::section::Tunnel>,
    /// The feedback endpoint and its governor (off by default).
    pub feedback: Option<feedback::Feedback>,
    /// Blocklist feeds, denied through the deny set; country and ASN
    /// groups (none by default).
    pub feeds: Vec<feed::Feed>,
    pub groups: Vec<crate::groups::section::Group>,
    /// Files of networks the operator keeps, read by their kind (none by
    /// default).
    pub sources: Vec<crate::sources::section::Source>,
    /// CrowdSec's decisions, denied through the deny set (off by default).
    pub crowdsec: Option<crowdsec::Crowdsec>,
    /// The fleet's shared store (off by default: fleet-scope quotas then
    /// count this host only, and say so).
    pub fleet: Option<fleet::Fleet>,
    /// Rules announced upstream over BGP (off by default).
    pub upstream: Option<Box<upstream::Upstream>>,
    /// When an attack begins and ends, and whom it is told (detected with
    /// the defaults unless set).
    pub attacks: attacks::Attacks,
    /// A reload of this policy may lift most of the running one's
    /// overrides or cut a rate more than 10x (refused otherwise).
    pub allow_shrink: bool,
    /// A kernel without what a feature asked for needs: refuse or run
    /// without it (see [`kernel`]).
    pub missing_kernel_feature: kernel::MissingFeature,
    /// Out-of-state TCP in the default class.
    pub tcp_state: TcpState,
}

impl Default for Policy {
    /// 1,000 packets/s with a burst of 2,000 per IPv4 /24 and IPv6 /56,
    /// enforced, 262,144 tracked prefixes: generous for any one
    /// well-behaved network in front of a TLS edge, far below a flood.
    /// New prefixes: 5,000 a second, burst 10,000, shared.
    fn default() -> Self {
        Self {
            default: Limit { rate: 1_000, burst: 2_000, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
            classes: Vec::new(),
            overrides: Vec::new(),
            new_sources: Some(DEFAULT_NEW_SOURCES),
            aggregate: None,
            v4_prefix: 24,
            v6_prefix: 56,
            capacity: limiter_common::maps::DEFAULT_BUCKET_CAPACITY,
            forwards: Vec::new(),
            tunnels: Vec::new(),
            feedback: None,
            feeds: Vec::new(),
            groups: Vec::new(),
            sources: Vec::new(),
            crowdsec: None,
            fleet: None,
            upstream: None,
            attacks: attacks::Attacks::default(),
            allow_shrink: false,
            missing_kernel_feature: kernel::MissingFeature::Refuse,
            tcp_state: TcpState::Auto,
        }
    }
}

impl Policy {
    /// Names of the classes by index (0 = `default`).
    #[must_use]
    pub fn class_names(&self) -> Vec<&str> {
        std::iter::once("default").chain(self.classes.iter().map(|c| c.name.as_str())).collect()
    }

    /// One line about this policy as version `version`.
    #[must_use]
    pub fn summary(&self, version: u64) -> Summary<'_> {
        Summary { policy: self, version }
    }
}

#[cfg(test)]
mod shipped_tests;
#[cfg(test)]
mod tests;
