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
#![expect(
    clippy::inline_always,
    reason = "hot-path helpers shared with the XDP program"
)]

pub mod gcra;
pub mod prefix;
pub mod reason;

pub use reason::{REASON_COUNT, Reason, Verdict};

/// Map names, one spelling for both sides.
pub mod maps {
    /// `LRU_HASH<BucketKey, BucketState>`: one GCRA state per source prefix.
    pub const BUCKETS: &str = "BUCKETS";
    /// `ARRAY<Config>` with one entry: the policy the data plane enforces.
    pub const CONFIG: &str = "CONFIG";
    /// `PERCPU_ARRAY<Counter>` indexed by [`crate::Reason`].
    pub const STATS: &str = "STATS";
    /// `ARRAY<u64>` with one entry: the injected clock of the test entry point.
    pub const TEST_CLOCK: &str = "TEST_CLOCK";
    /// `ARRAY<Meta>` with one entry: schema of the pinned maps. Not read by
    /// the program; pinned beside the maps so a later daemon can tell
    /// whether it may re-adopt them.
    pub const META: &str = "META";
    /// Default capacity of [`BUCKETS`] (tracked prefixes).
    pub const DEFAULT_BUCKET_CAPACITY: u32 = 1 << 18;
}

/// Program (entry point) names in the object.
pub mod programs {
    /// Production entry point: time from `bpf_ktime_get_coarse_ns`.
    pub const LIMITER: &str = "limiter";
    /// Test entry point: identical code, time read from `TEST_CLOCK`.
    pub const LIMITER_TEST_CLOCK: &str = "limiter_test_clock";
    /// Bench baseline: returns `XDP_DROP` and nothing else.
    pub const BASELINE_DROP: &str = "baseline_drop";
}

/// Address families as stored in [`BucketKey::family`].
pub mod family {
    pub const IPV4: u8 = 4;
    pub const IPV6: u8 = 6;
}

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
}

/// The policy the data plane enforces. Written by userspace, read per packet.
///
/// Derived fields (`unit`, `tau`) are computed by [`Config::new`] so the
/// kernel never divides: a charge is `cost * unit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Units (packets or bytes) per second. 1..=[`gcra::MAX_RATE`].
    pub rate: u64,
    /// Bucket depth in units.
    pub burst: u64,
    /// [`gcra::unit_interval`]: the charge of one unit, in 1/16 ns.
    pub unit: u64,
    /// [`gcra::tau`]: how far a bucket may run ahead of now, in 1/16 ns.
    pub tau: u64,
    /// [`cost::PACKETS`] or [`cost::BYTES`].
    pub cost: u32,
    /// IPv4 source prefix length, 0..=32.
    pub v4_prefix: u32,
    /// IPv6 source prefix length, 0..=128.
    pub v6_prefix: u32,
    /// [`flags`] bits.
    pub flags: u32,
}

impl Config {
    /// A complete config, or `None` if `rate` is outside `1..=MAX_RATE` or
    /// `burst * unit` overflows. Other fields are checked by the caller
    /// (see `limiter-user`'s policy module).
    #[must_use]
    pub const fn new(
        rate: u64,
        burst: u64,
        cost: u32,
        v4_prefix: u32,
        v6_prefix: u32,
    ) -> Option<Self> {
        if rate == 0 || rate > gcra::MAX_RATE {
            return None;
        }
        let unit = gcra::unit_interval(rate);
        let Some(tau) = gcra::tau(burst, unit) else {
            return None;
        };
        Some(Self {
            rate,
            burst,
            unit,
            tau,
            cost,
            v4_prefix,
            v6_prefix,
            flags: flags::CONFIGURED,
        })
    }
}

/// "LIMT": marks a [`Meta`] written by this project.
pub const META_MAGIC: u32 = 0x4c49_4d54;
/// Version of the pinned-map layout. Bump it whenever a pinned map's key,
/// value or meaning changes; a daemon refuses pins of another version.
pub const SCHEMA_VERSION: u32 = 1;

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

/// Key of [`maps::BUCKETS`]: family and source address masked to its prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// [`family::IPV4`] or [`family::IPV6`].
    pub family: u8,
    /// Prefix length the address was masked to.
    pub prefix_len: u8,
    /// Rule class (0 = default); reserved for per-class budgets.
    pub class: u8,
    /// Always zero (explicit padding).
    pub pad: u8,
    /// Masked address in network byte order; IPv4 uses `addr[0]` only.
    pub addr: [u32; 4],
}

/// Value of [`maps::BUCKETS`]: GCRA theoretical arrival time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketState {
    /// 1/16 ns on the data plane's clock; updated with one compare-and-swap.
    pub tat: u64,
}

/// One slot of [`maps::STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

const _: () = assert!(core::mem::size_of::<Config>() == 48);
const _: () = assert!(core::mem::size_of::<BucketKey>() == 20);
const _: () = assert!(core::mem::size_of::<BucketState>() == 8);
const _: () = assert!(core::mem::size_of::<Counter>() == 16);
const _: () = assert!(core::mem::size_of::<Meta>() == 16);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all five are #[repr(C)], Copy, contain only integers and have
    // no implicit padding (sizes asserted above).
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::BucketKey {}
    unsafe impl aya::Pod for super::BucketState {}
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for super::Meta {}
}
