//! The contract between the XDP program and userspace.
//!
//! Everything that crosses the kernel/user boundary lives here: map names
//! and capacities, `#[repr(C)]` keys and values (no `bool`, no `Option`, no
//! implicit padding; sizes asserted at compile time), the verdict reasons,
//! and the admission arithmetic as pure integer functions so the very same
//! code runs in the kernel and in host unit tests.
#![no_std]
// The XDP program needs these tiny helpers inlined: BPF-to-BPF calls would
// lose the verifier's knowledge of packet bounds and cost a call each.
#![expect(clippy::inline_always, reason = "hot-path helpers shared with the XDP program")]

pub mod capture;
pub mod cookie;
pub mod deny;
pub mod gcra;
pub mod groups;
pub mod lease;
mod limits;
pub mod maps;
pub mod packet;
pub mod prefix;
pub mod reason;
pub mod resolution;
pub mod rules;
pub mod stats;
pub mod tcp_state;
pub mod tunnel;
pub mod window;

pub use limits::ClassLimits;
pub use reason::{Action, REASON_COUNT, Reason, Verdict};
pub use stats::{ClassCounters, Counter, STAT_ENTRIES, STAT_FAMILIES, UNCLASSIFIED, stat_index, stat_slot};

/// `a == b`, usable in constants: the XDP program asserts at compile time
/// that each map's symbol is spelled as in [`maps`].
#[must_use]
pub const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The run priority `limiter_chain` is built with (libxdp: lower runs
/// first; its own default is 50): before the other components, so floods
/// are dropped before anything else spends on them. The daemon rewrites it
/// in the object's BTF before loading when the operator chooses another.
pub const RUN_PRIORITY_DEFAULT: u32 = 10;

/// Program (entry point) names in the object.
pub mod programs {
    /// Production entry point: time from `bpf_ktime_get_coarse_ns`.
    pub const LIMITER: &str = "limiter";
    /// Test entry point: identical code, time read from `TEST_CLOCK`.
    pub const LIMITER_TEST_CLOCK: &str = "limiter_test_clock";
    /// Bench baseline: returns `XDP_DROP` and nothing else.
    pub const BASELINE_DROP: &str = "baseline_drop";
    /// Bench receiver for the netfilter rows: returns `XDP_PASS`.
    pub const BENCH_PASS: &str = "bench_pass";
    /// Bench receiver: read the IPv4 source address, then `XDP_DROP`.
    pub const BENCH_TOUCH_DROP: &str = "bench_touch_drop";
    /// Bench floor: clock, shared LRU hit, compare-and-swap, one counter.
    pub const BENCH_FLOOR: &str = "bench_floor";
    /// Bench generator (live frames): returns `XDP_TX`.
    pub const BENCH_TX: &str = "bench_tx";
    /// Bench generator (live frames): random source in 198.19.0.0/16, `XDP_TX`.
    pub const BENCH_TX_SPREAD: &str = "bench_tx_spread";
    /// Test flood generator: drop the replies to its spoofed sources.
    pub const BENCH_DROP_FLOOD_REPLIES: &str = "bench_drop_flood_replies";
    /// The production program as a libxdp dispatcher's component.
    pub const LIMITER_CHAIN: &str = "limiter_chain";
    /// The program whose global function `limiter_chain` is loaded against.
    pub const LIMITER_SLOT_HOST: &str = "limiter_slot_host";
    /// Entry points of the production object; the others are in the bench
    /// object only (limiter-ebpf's `bench` feature).
    pub const PRODUCTION: [&str; 2] = [LIMITER, LIMITER_TEST_CLOCK];
}

/// Address families, one encoding everywhere: the IP version, as stored
/// in [`BucketKey::family`] and the other keys, and as [`packet::parse`]
/// reports it; `STATS` keeps a slot for each ([`family::slot`]).
pub mod family {
    /// An address family: its IP version in one byte, the same in every
    /// key, event and counter slot. A type of its own, so a slot index or
    /// a prefix length is never taken for one.
    #[repr(transparent)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct Family(pub u8);

    /// Not IP, or not yet known.
    pub const NONE: Family = Family(0);
    pub const IPV4: Family = Family(4);
    pub const IPV6: Family = Family(6);
    /// Every family, in the order of their `STATS` slots.
    pub const ALL: [Family; 3] = [NONE, IPV4, IPV6];

    /// The family's slot in `STATS` (0, 1, 2 for [`NONE`], [`IPV4`],
    /// [`IPV6`]): two shifts, no table and no branch on the hot path.
    #[must_use]
    pub const fn slot(family: Family) -> u32 {
        ((family.0 >> 1) - (family.0 >> 2)) as u32
    }

    /// The `family` label of the metrics.
    #[must_use]
    pub const fn label(family: Family) -> &'static str {
        match family {
            IPV4 => "ipv4",
            IPV6 => "ipv6",
            _ => "none",
        }
    }
}

pub use family::Family;

/// Enforcement mode of a class.
pub mod mode {
    /// Drop what exceeds the allowance.
    pub const ENFORCE: u32 = 0;
    /// Pass it, counted as `shadow_dropped`: a dry run on live traffic.
    pub const SHADOW: u32 = 1;
}

/// Rule classes: class 0 is the default; matchers send packets to others.
pub const MAX_CLASSES: usize = 8;
/// Matchers in one policy (a class with several port ranges uses several).
pub const MAX_MATCHERS: usize = 16;

/// What one admitted packet costs.
pub mod cost {
    /// Every packet costs one unit.
    pub const PACKETS: u32 = 0;
    /// A packet costs its frame length in bytes (Ethernet header included).
    pub const BYTES: u32 = 1;
}

/// Bits of [`Config::flags`].
pub mod flags {
    /// Set by userspace once the config entry is complete. A zeroed entry
    /// (program loaded, no policy yet) passes everything as `NoConfig`.
    pub const CONFIGURED: u32 = 1;
    /// Some class has `syn_cookies` on and the kernel will accept the
    /// cookies' ACKs (the daemon checked `net.ipv4.tcp_syncookies`).
    pub const SYN_COOKIES: u32 = 2;
    /// The policy forwards some destinations at the driver
    /// ([`crate::tunnel`]): a packet the limiter passes is asked of the
    /// service map.
    pub const TUNNELS: u32 = 4;
    /// Bits `ANSWERS_SHIFT + class`: the UDP classes that take source
    /// ports (reflection classes). A packet of one that its budget refuses
    /// is asked of the host's sockets, and passes (`own_answer`) when it
    /// answers one this host connected to its source.
    pub const ANSWERS_SHIFT: u32 = 8;
    /// Bits `TCP_STATE_SHIFT + class`: the class judges out-of-state TCP
    /// (`tcp_state` not `off`, [`crate::tcp_state`]).
    pub const TCP_STATE_SHIFT: u32 = 16;
    /// Bits `TCP_STATE_AUTO_SHIFT + class`: and only while `auto` is
    /// engaged.
    pub const TCP_STATE_AUTO_SHIFT: u32 = 24;
}

/// Sends matching packets to a class. All conditions must hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Matcher {
    /// IP protocol (6 TCP, 17 UDP, ...); 0 = any.
    pub proto: u8,
    /// 1 = only TCP SYN without ACK (new connections).
    pub syn: u8,
    /// Class index, `1..MAX_CLASSES`.
    pub class: u8,
    /// Which port the range is of ([`port_side`]; zero in the layout's
    /// padding byte before, so an older policy's matchers read as
    /// destination ports).
    pub side: u8,
    /// Port range, inclusive; `0..=65535` also matches packets without a
    /// port (non-first fragments, other protocols).
    pub port_lo: u16,
    pub port_hi: u16,
}

/// Which port of a packet a [`Matcher`]'s range is of.
pub mod port_side {
    /// The destination port (a service of this host).
    pub const DESTINATION: u8 = 0;
    /// The source port (a reflection class: the answers of a service
    /// elsewhere, DNS from 53, NTP from 123).
    pub const SOURCE: u8 = 1;
}

/// The policy the data plane enforces. Written by userspace into the
/// inactive `CONFIG` slot, read per packet from the active one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Policy version; buckets cache per-prefix resolutions against it.
    /// The first field of every layout: an upgrade that renews `CONFIG`
    /// reads it from the old one to continue the count.
    pub version: u64,
    /// IPv4 source prefix length, 0..=32.
    pub v4_prefix: u32,
    /// IPv6 source prefix length, 0..=[`MAX_V6_BUCKET_PREFIX`].
    pub v6_prefix: u32,
    /// Matchers in use, `0..=MAX_MATCHERS`; the first that matches wins.
    pub n_matchers: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Emit a [`DropEvent`] for one drop in this many, drawn at random
    /// for each drop (a power of two; 0 = none). Feeds the top-offenders
    /// list, escalation and link pressure.
    pub drop_sample: u32,
    /// Possible CPUs of the host (set by the loader when it writes the
    /// entry): how many leases of one bucket may be out at once
    /// ([`lease`]). 0 = leases off.
    pub cpus: u32,
    /// New-source budget: charge per bucket creation in 1/16 ns, and its
    /// tolerance ([`gcra::unit_interval`], [`gcra::tau`]); 0 = unlimited.
    pub new_unit: u64,
    pub new_tau: u64,
    /// Aggregate tier: a coarser prefix charged together with the fine
    /// one (default class only). `agg_unit == 0` = off.
    pub agg_unit: u64,
    pub agg_tau: u64,
    pub agg_v4_prefix: u32,
    pub agg_v6_prefix: u32,
    /// Class 0 is the default class.
    pub classes: [ClassLimits; MAX_CLASSES],
    pub matchers: [Matcher; MAX_MATCHERS],
    /// SYN cookies per class ([`cookie`]); read only with
    /// [`flags::SYN_COOKIES`] set.
    pub cookies: cookie::Cookies,
}

/// Default of [`Config::drop_sample`]: one drop in 64, at random, is
/// sampled for the top-offenders list.
pub const DROP_SAMPLE: u32 = 64;

/// "LIMT": marks a [`Meta`] written by this project.
pub const META_MAGIC: u32 = 0x4c49_4d54;
/// Version of the pinned-map layout. Bump it whenever a pinned map's key,
/// value or meaning changes (and say so in the map's entry of the
/// daemon's table of pinned maps). 12: `STATS` counts per class too, and
/// `CLASS_STATS` is gone. 13: `STATS` has a slot for `tcp_bad_flags`.
/// 14: `WINDOWS` and `FLEET` keep the leaving slice and a share.
/// 15: the deny set (`DENY`, `DENY_LENS`, `DENY_HITS`, `DENY_ORIGINS`,
/// `DENY_SOURCES`); `ACTIVE`'s bits above the slot count its changes
/// (an older program reads only the slot bit).
/// 16: country and ASN groups (`GROUPS4`, `GROUPS6`, `GROUP_LIMITS`,
/// `GROUP_BUCKETS`, `GROUP_HITS`); `STATS` has a slot for
/// `group_limited`; a bucket's resolution may name a group.
/// 17: `STATS` has a slot for `own_answer`; `GROUP_HITS` holds each
/// CPU's lease of its group's budget.
/// 18: `STATS` has a slot for `tcp_out_of_state`.
/// 19: the tunnels' maps pinned (`TUNNEL_SERVICES`, `TUNNEL_TABLE`,
/// `TUNNEL_BACKENDS`, `TUNNEL_CONNS`, `TUNNEL_HITS`, `TUNNEL_OUTCOMES`):
/// a restart keeps each connection on its backend, and the drains.
pub const SCHEMA_VERSION: u32 = 19;

/// Value of [`maps::META`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// [`META_MAGIC`] once written.
    pub magic: u32,
    /// [`SCHEMA_VERSION`] of the daemon that created the maps.
    pub schema: u32,
    /// Interface the pinned link is attached to (0 = none yet).
    pub ifindex: u32,
    /// Always zero (explicit padding).
    pub pad: u32,
}

/// Finest IPv6 bucket prefix. A host holds a whole /64, so finer buckets
/// would be bypassed by rotating addresses inside it; in exchange the key
/// keeps 64 bits of address and is 12 bytes, which makes the hash lookup on
/// every packet about a third cheaper than with the full 128 bits.
pub const MAX_V6_BUCKET_PREFIX: u32 = 64;

/// Key of [`maps::BUCKETS`]: family and source address masked to its prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// [`family::IPV4`] or [`family::IPV6`].
    pub family: Family,
    /// Prefix length the address was masked to.
    pub prefix_len: u8,
    /// Rule class (0 = default); reserved for per-class budgets.
    pub class: u8,
    /// Always zero (explicit padding).
    pub pad: u8,
    /// Masked address in network byte order: IPv4 in `addr[0]` (`addr[1]`
    /// is zero), IPv6 its first 64 bits (see [`MAX_V6_BUCKET_PREFIX`]).
    pub addr: [u32; 2],
}

impl BucketKey {
    /// The key as two words, for the program's global functions (which
    /// take scalars): `family, prefix_len, class, pad, addr[0]` in
    /// memory order, and `addr[1]`.
    #[inline(always)]
    #[must_use]
    pub fn words(&self) -> (u64, u64) {
        let head = u64::from(u32::from_ne_bytes([self.family.0, self.prefix_len, self.class, self.pad]));
        (head | u64::from(self.addr[0]) << 32, u64::from(self.addr[1]))
    }

    /// The key of [`Self::words`].
    #[inline(always)]
    #[must_use]
    #[expect(clippy::cast_possible_truncation, reason = "each half of a word")]
    pub fn from_words(head: u64, tail: u64) -> Self {
        let [family, prefix_len, class, pad] = (head as u32).to_ne_bytes();
        Self { family: Family(family), prefix_len, class, pad, addr: [(head >> 32) as u32, tail as u32] }
    }
}

/// Value of [`maps::BUCKETS`]: GCRA theoretical arrival time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketState {
    /// 1/16 ns on the data plane's clock; updated with one compare-and-swap.
    pub tat: u64,
    /// Cached override lookup: `(policy version as u32) << 32 | resolution`,
    /// one 8-byte word so it is read and written whole. The trie is only
    /// consulted again when the policy version changes.
    pub resolved: u64,
}

/// Value of [`maps::CLOCK_CACHE`]: `CLOCK_MONOTONIC_COARSE` only moves
/// when the jiffies do (both at the tick), so a CPU reads it once per
/// jiffy and reuses it for every packet until `jiffies64` moves on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockCache {
    /// `jiffies64` when `ns` was read.
    pub jiffy: u64,
    /// `bpf_ktime_get_coarse_ns` then.
    pub ns: u64,
}

/// Key of [`maps::RUNTIME`]: one overridden network.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeKey {
    /// [`family::IPV4`] (address in the first 4 bytes) or [`family::IPV6`].
    pub family: Family,
    pub prefix_len: u8,
    /// Always zero (explicit padding).
    pub pad: [u8; 2],
    pub addr: [u8; 16],
}

/// Value of [`maps::RUNTIME`]: what `limiter prefix` set for a network.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeOverride {
    /// [`runtime_action`] code.
    pub action: u32,
    /// [`cost`] and [`mode`] of a `LIMIT` (zero otherwise).
    pub cost: u32,
    pub mode: u32,
    /// Unix time (seconds) at which the override expires; 0 = never.
    /// (Was padding, always 0: records of earlier daemons never expire.)
    pub expires: u32,
    /// Rate and burst of a `LIMIT` (zero otherwise).
    pub rate: u64,
    pub burst: u64,
}

/// [`RuntimeOverride::action`] codes.
pub mod runtime_action {
    /// The policy file's override for this network is removed.
    pub const UNSET: u32 = 0;
    pub const LIMIT: u32 = 1;
    pub const ALLOW: u32 = 2;
    pub const DENY: u32 = 3;
}

/// Key of [`maps::OWN_ANSWERS`]: a connected UDP socket of this host as
/// an answer to it reaches it: the answer's source (the socket's peer)
/// and destination (the socket's own address), each port in network
/// order. An own answer is charged to its socket's budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnswerKey {
    /// The peer's address, network order (IPv4 in `peer[0]`).
    pub peer: [u32; 4],
    /// This host's address the socket is bound to.
    pub local: [u32; 4],
    /// The peer's port in the low half, this host's in the high half.
    pub ports: u32,
    /// [`family::IPV4`] or [`family::IPV6`].
    pub family: u32,
}

/// A sampled drop, for the top-offenders list and escalation: which
/// bucket, why, and from which address. Also sent, unsampled, for every
/// `syn_cookie_verified` ACK: that address proved itself (escalation
/// counts only the drops of proven addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropEvent {
    pub key: BucketKey,
    /// The [`Reason`] as its index.
    pub reason: u32,
    /// The packet's source address, network byte order (IPv4 in
    /// `src[0]`; the family is the key's). Events of builds before it are
    /// 16 bytes long and have none.
    pub src: [u32; 4],
    /// 1: a rate-limited TCP segment of a connection this host holds
    /// (evidence a blind spoofer cannot forge). Events of builds before
    /// it are 32 bytes long and say 0.
    pub held: u32,
    /// Where the packet went: its destination port (bits 0-15) and IP
    /// protocol (bits 16-23), with [`DropEvent::PORT_READ`] set when a
    /// TCP or UDP port was read. Events of builds before it say 0.
    pub dst: u32,
}

impl DropEvent {
    /// [`DropEvent::dst`]'s bit: the port was read.
    pub const PORT_READ: u32 = 1 << 24;

    /// The destination port and IP protocol, if the port was read.
    #[must_use]
    pub const fn port(&self) -> Option<(u8, u16)> {
        if self.dst & Self::PORT_READ == 0 {
            return None;
        }
        #[expect(clippy::cast_possible_truncation, reason = "the fields' bits")]
        Some(((self.dst >> 16) as u8, self.dst as u16))
    }
}

mod layout;
