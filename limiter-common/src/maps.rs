//! Every map of the program in one table ([`TABLE`]): its name (one
//! spelling for both sides), kind, key and value sizes, entries, flags,
//! and the schema in which a pinned map's layout or meaning last changed.
//! The program declares each map from its row (`limiter-ebpf/src/maps.rs`
//! checks kind and sizes at compile time), and the loader pins, adopts and
//! upgrades the pinned rows. Adding a map or changing a layout is a row
//! here and the code that uses it.

use core::mem::size_of;

use crate::{
    AnswerKey, BucketKey, BucketState, ClassLimits, ClockCache, Config, Counter, MAX_CLASSES, Meta, RuntimeKey,
    RuntimeOverride, STAT_ENTRIES,
    capture::CaptureCtl,
    cookie::{REFRESH_SLOTS, SynGuard},
    deny::{DenyKey, DenyLens, MAX_ORIGINS, OriginName},
    groups::{GroupHits, GroupLimits, MAX_GROUPS, MAX_NETWORKS as GROUP_NETWORKS},
    lease::CpuSlot,
    tunnel,
    window::{FleetSlot, WindowState},
};

/// `LRU_HASH<BucketKey, BucketState>`: one GCRA state per source prefix.
pub const BUCKETS: &str = "BUCKETS";
/// `ARRAY<Config>` with two slots: the policy the data plane enforces is
/// the slot named by [`ACTIVE`]. Userspace writes the other slot whole,
/// then flips `ACTIVE` (one 4-byte store), so a packet never sees half
/// of one policy and half of another.
pub const CONFIG: &str = "CONFIG";
/// `ARRAY<u32>` with one entry: index of the active `CONFIG` slot.
pub const ACTIVE: &str = "ACTIVE";
/// Pinned by schemas before 12: `PERCPU_ARRAY<ClassCounters>` indexed
/// by rule class, now folded into [`STATS`]. An upgrade removes its pin.
pub const CLASS_STATS: &str = "CLASS_STATS";
/// `LPM_TRIE<Key<u32>, u32>` per `CONFIG` slot: IPv4 overrides, valued
/// with a [`crate::resolution`] code.
pub const OVR4: [&str; 2] = ["OVR4_0", "OVR4_1"];
/// `LPM_TRIE<Key<[u32; 4]>, u32>` per `CONFIG` slot: IPv6 overrides.
pub const OVR6: [&str; 2] = ["OVR6_0", "OVR6_1"];
/// `ARRAY<ClassLimits>`, `2 * MAX_OVERRIDES` entries: the limits of
/// override `n` of slot `s` are at `s * MAX_OVERRIDES + n - 1`.
pub const OVR_LIMITS: &str = "OVR_LIMITS";
/// `RINGBUF` of [`crate::DropEvent`]: one in `Config::drop_sample` drops.
pub const DROP_EVENTS: &str = "DROP_EVENTS";
/// Size of [`DROP_EVENTS`] in bytes.
pub const DROP_EVENTS_BYTES: u32 = 1 << 18;
/// `RINGBUF` of [`crate::capture::CaptureRecord`]: the frames copied
/// while `CAPTURE` is on.
pub const CAPTURES: &str = "CAPTURES";
/// Size of [`CAPTURES`] in bytes (about 14,000 frames).
pub const CAPTURES_BYTES: u32 = 1 << 22;
/// `ARRAY<crate::capture::CaptureCtl>`, one entry: whether and how often
/// frames are copied into [`CAPTURES`].
pub const CAPTURE: &str = "CAPTURE";
/// The program's mutable globals (its `.bss`), one entry of 4 bytes:
/// `LIMITER_PASSES`, one passed frame in how many is copied into
/// [`CAPTURES`] (a power of two; 0: none). A global, not a map entry,
/// because the admit path reads it straight from memory (one load, no
/// lookup).
pub const GLOBALS: &str = ".bss";
/// `PERCPU_ARRAY<u64>`, one entry: when a sampled drop was last
/// logged (debug level), to rate-limit those lines.
pub const DROP_SAMPLER: &str = "DROP_SAMPLER";
/// `PERCPU_ARRAY<crate::ClockCache>`, one entry: each CPU's copy of the
/// coarse clock for the current jiffy.
pub const CLOCK_CACHE: &str = "CLOCK_CACHE";
/// `ARRAY<u64>`, one entry: GCRA state of the shared new-source budget.
pub const NEW_SOURCES: &str = "NEW_SOURCES";
/// `PERCPU_ARRAY<crate::lease::CpuSlot>`, [`CPU_SLOTS_ENTRIES`]
/// entries: each CPU's leases of buckets' credit, and its cache of
/// buckets that refuse until a known time.
pub const CPU_SLOTS: &str = "CPU_SLOTS";
/// `HASH<crate::RuntimeKey, crate::RuntimeOverride>`, up to
/// [`MAX_OVERRIDES`] entries, allocated as used: the overrides set at
/// run time (`limiter prefix ...`), pinned so that a restarted daemon
/// puts them back. Written and read by userspace only.
pub const RUNTIME: &str = "RUNTIME";
/// `HASH<crate::deny::DenyKey, u32>`, up to [`MAX_DENIES`] entries,
/// allocated as used: the deny set's networks and the markers of finer
/// ones under their bucket prefix (`crate::deny`). Written by
/// userspace, entry by entry; read by XDP when a bucket resolves, and
/// per packet of a bucket with a marker.
pub const DENY: &str = "DENY";
/// Entries of [`DENY`]: a million networks and as many markers.
pub const MAX_DENIES: u32 = 1 << 21;
/// `ARRAY<crate::deny::DenyLens>`, two slots (`ACTIVE`'s bit 1 names
/// the one in use): which prefix lengths of [`DENY`] hold a network.
pub const DENY_LENS: &str = "DENY_LENS";
/// `PERCPU_ARRAY<u64>`, [`crate::deny::MAX_ORIGINS`] entries: packets
/// dropped by the deny set, by origin.
pub const DENY_HITS: &str = "DENY_HITS";
/// `ARRAY<crate::deny::OriginName>`, [`crate::deny::MAX_ORIGINS`]
/// entries: each origin's name, so a restarted daemon reads the set
/// back with its origins. Userspace only.
pub const DENY_ORIGINS: &str = "DENY_ORIGINS";
/// `ARRAY<u64>`, one entry: GCRA state of the budget that denied
/// prefixes' buckets are created under (the new-source budget's rate,
/// its own state).
pub const DENY_SOURCES: &str = "DENY_SOURCES";
/// `LPM_TRIE<Key<u32>, u32>`: the IPv4 networks of the rate and allow
/// groups (`crate::groups`), valued with the group's index, none finer
/// than the bucket prefix. Written by userspace, entry by entry (then
/// `ACTIVE`'s change count moves); read by XDP when a bucket resolves.
pub const GROUPS4: &str = "GROUPS4";
/// `LPM_TRIE<Key<[u32; 2]>, u32>`: the IPv6 ones (their top 64 bits).
pub const GROUPS6: &str = "GROUPS6";
/// `ARRAY<crate::groups::GroupLimits>`, `2 * MAX_GROUPS` entries: group
/// `n` of `CONFIG` slot `s` at `s * MAX_GROUPS + n`.
pub const GROUP_LIMITS: &str = "GROUP_LIMITS";
/// `ARRAY<u64>`, `MAX_GROUPS` entries: each group's GCRA state, shared
/// by every CPU (compare-and-swap).
pub const GROUP_BUCKETS: &str = "GROUP_BUCKETS";
/// `PERCPU_ARRAY<crate::groups::GroupHits>`, `MAX_GROUPS` entries.
pub const GROUP_HITS: &str = "GROUP_HITS";
/// Entries of [`CPU_SLOTS`] per CPU (the lease's slot table).
pub use crate::lease::CPU_SLOTS_ENTRIES;
/// Overrides one policy may hold (both families together).
pub const MAX_OVERRIDES: u32 = 131_072;
/// `PERCPU_ARRAY<Counter>`, [`crate::STAT_ENTRIES`] entries: every
/// packet counted once, under its class (or [`crate::UNCLASSIFIED`]),
/// reason and stat family ([`crate::stat_index`]).
pub const STATS: &str = "STATS";
/// `ARRAY<u64>` with one entry: the injected clock of the test entry point.
pub const TEST_CLOCK: &str = "TEST_CLOCK";
/// `ARRAY<Meta>` with one entry: schema of the pinned maps. Not read by
/// the program; pinned beside the maps so a later daemon can tell
/// whether it may re-adopt them.
pub const META: &str = "META";
/// `HASH<[u8; 16], u32>`: each pinned map's name (zero-padded) and the
/// schema its layout or meaning last changed in, as the build that
/// pinned them knew it; an older build reads it to roll back. Written
/// by: userspace. Not read by XDP.
pub const LAYOUT: &str = "LAYOUT";
/// Entries of [`LAYOUT`]: room for every pinned map of any build.
pub const LAYOUT_ENTRIES: u32 = 64;
/// `LRU_HASH<BucketKey, crate::window::WindowState>`: the slice
/// counts of each prefix of a window-quota class, written by the
/// program only (atomically, from every CPU).
pub const WINDOWS: &str = "WINDOWS";
/// `LRU_HASH<BucketKey, crate::window::WindowState>`: for fleet-scope
/// classes, the other nodes' slice counts, written by the daemon only.
pub const FLEET: &str = "FLEET";
/// `RINGBUF` of [`crate::window::Touch`]: a fleet-scope prefix's first
/// packet in each sync epoch, so the daemon syncs what changed without
/// walking [`WINDOWS`].
pub const TOUCHED: &str = "TOUCHED";
/// `ARRAY<u64>`, an entry per [`crate::window::FleetSlot`] (the sync
/// epoch, the split divisor while the store is down, the wall clock's
/// offset), written by the daemon.
pub const FLEET_STATE: &str = "FLEET_STATE";
/// `ARRAY<crate::cookie::SynGuard>` indexed by class: the `auto`
/// trigger of SYN cookies, written by the program; the daemon reads
/// it to report whether a class's cookies are engaged.
pub const SYN_GUARD: &str = "SYN_GUARD";
/// `ARRAY<u64>`, [`crate::cookie::REFRESH_SLOTS`] entries, program
/// only: when a SYN to each port (per family) was last handed to the
/// kernel's own cookie path.
pub const KERNEL_SYNS: &str = "KERNEL_SYNS";
/// `LRU_HASH<crate::AnswerKey, u64>`, [`OWN_ANSWERS_ENTRIES`] entries,
/// program only: the GCRA state of each connected UDP socket's own
/// answers (`own_answer`), which pass a reflection class's refusal only
/// within the class's allowance per socket, so a local user who connects
/// a socket to a spoofed source opens no uncharged hole.
pub const OWN_ANSWERS: &str = "OWN_ANSWERS";
/// `ARRAY<crate::cookie::SynGuard>` indexed by class: the `auto`
/// trigger of the out-of-state check ([`crate::tcp_state`]), written by
/// the program; the daemon reads it to report whether it is engaged.
pub const TCP_GUARD: &str = "TCP_GUARD";
/// `PERCPU_ARRAY<crate::tcp_state::Held>`,
/// [`crate::tcp_state::HELD_ENTRIES`] entries per CPU, program only: the
/// connections found held, remembered for [`crate::tcp_state::REMEMBER`].
pub const TCP_HELD: &str = "TCP_HELD";
/// `HASH<crate::tunnel::ServiceKey, crate::tunnel::Service>`,
/// [`crate::tunnel::SERVICE_PORTS`] entries, written by the daemon: the
/// destinations forwarded at the driver.
pub const TUNNEL_SERVICES: &str = "TUNNEL_SERVICES";
/// `ARRAY<u32>`, [`crate::tunnel::MAX_SERVICES`] tables of
/// [`crate::tunnel::TABLE_SIZE`] slots, written by the daemon: each
/// service's Maglev table of backend indexes.
pub const TUNNEL_TABLE: &str = "TUNNEL_TABLE";
/// `ARRAY<crate::tunnel::Backend>` by backend index, written by the
/// daemon (its address, and whether it is up, down or drained).
pub const TUNNEL_BACKENDS: &str = "TUNNEL_BACKENDS";
/// `LRU_HASH<crate::tunnel::Flow, u32>`, [`crate::tunnel::CONNECTIONS`]
/// entries, program only: each flow's backend.
pub const TUNNEL_CONNS: &str = "TUNNEL_CONNS";
/// `PERCPU_ARRAY<crate::tunnel::Hop>` by backend index: each backend's
/// next hop as this CPU last looked it up; cleared by the daemon when it
/// writes the backends.
pub const TUNNEL_HOPS: &str = "TUNNEL_HOPS";
/// `PERCPU_ARRAY<[u64; 8]>`, one entry, program only: the parameters of
/// a next hop's lookup (64 bytes the program's stack has no room for).
pub const TUNNEL_FIB: &str = "TUNNEL_FIB";
/// `PERCPU_ARRAY<crate::Counter>` by backend index: packets and bytes
/// forwarded to it.
pub const TUNNEL_HITS: &str = "TUNNEL_HITS";
/// `PERCPU_ARRAY<u64>`, [`crate::tunnel::OUTCOMES`] entries: packets of
/// services not forwarded, by [`crate::tunnel::outcome`].
pub const TUNNEL_OUTCOMES: &str = "TUNNEL_OUTCOMES";
/// Sockets whose own answers are tracked at once (only connected UDP
/// sockets of this host make entries).
pub const OWN_ANSWERS_ENTRIES: u32 = 16_384;
/// Size of [`TOUCHED`] in bytes.
pub const TOUCHED_BYTES: u32 = 1 << 20;
/// Default capacity of [`BUCKETS`] (tracked prefixes).
pub const DEFAULT_BUCKET_CAPACITY: u32 = 1 << 18;
/// Largest capacity of [`BUCKETS`] a policy may ask for: 16 Mi
/// prefixes, about 1.6 GB of kernel memory at 96 B each. The kernel
/// refuses far larger LRU maps only when the daemon starts; the
/// policy check refuses them up front.
pub const MAX_BUCKET_CAPACITY: u32 = 1 << 24;

/// `BPF_F_NO_PREALLOC`: entries allocated as used.
pub const NO_PREALLOC: u32 = 1;

/// A map's kind, as the program declares it (aya's type of that name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Hash,
    LruHash,
    Array,
    PerCpuArray,
    LpmTrie,
    RingBuf,
}

impl Kind {
    /// The aya type the program declares a map of this kind with.
    #[must_use]
    pub const fn aya_type(self) -> &'static str {
        match self {
            Kind::Hash => "HashMap",
            Kind::LruHash => "LruHashMap",
            Kind::Array => "Array",
            Kind::PerCpuArray => "PerCpuArray",
            Kind::LpmTrie => "LpmTrie",
            Kind::RingBuf => "RingBuf",
        }
    }

    /// The kernel's key size for a declared key of `size` bytes (an LPM
    /// trie's key starts with its 4-byte prefix length).
    #[must_use]
    pub const fn key_size(self, size: usize) -> usize {
        match self {
            Kind::LpmTrie => size + 4,
            _ => size,
        }
    }
}

/// One row of [`TABLE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    /// Key and value sizes in bytes as the kernel sees them (0 for a ring
    /// buffer).
    pub key: usize,
    pub value: usize,
    /// Max entries (a ring buffer: its size in bytes); for a map sized
    /// `by_capacity`, the default.
    pub entries: u32,
    /// The loader sizes it from the policy's `capacity` (tracked prefixes),
    /// and an upgrade keeps a pinned one's size whatever it is.
    pub by_capacity: bool,
    /// Map flags ([`NO_PREALLOC`]).
    pub flags: u32,
    /// Pinned with the program, and the schema (`SCHEMA_VERSION`) in which
    /// its layout or meaning last changed; `None`: never pinned. Whoever
    /// changes a pinned map's key, value or meaning bumps the schema and
    /// sets it here. [`META`] is never renewed (it says what the other
    /// pins are): its layout stays.
    pub pinned: Option<u32>,
}

impl Spec {
    const fn new(name: &'static str, kind: Kind, key: usize, value: usize, entries: u32) -> Self {
        Self { name, kind, key, value, entries, flags: 0, by_capacity: false, pinned: None }
    }

    const fn by_capacity(self) -> Self {
        Self { by_capacity: true, ..self }
    }

    const fn pinned(self, since: u32) -> Self {
        Self { pinned: Some(since), ..self }
    }

    const fn flags(self, flags: u32) -> Self {
        Self { flags, ..self }
    }
}

#[expect(clippy::cast_possible_truncation, reason = "small constants")]
const STAT_ENTRIES_U32: u32 = STAT_ENTRIES as u32;
#[expect(clippy::cast_possible_truncation, reason = "small constants")]
const CLASSES_U32: u32 = MAX_CLASSES as u32;

/// Every map of the program; the pinned ones first, in the order the
/// loader pins them.
pub const TABLE: [Spec; 48] = [
    Spec::new(BUCKETS, Kind::LruHash, size_of::<BucketKey>(), size_of::<BucketState>(), DEFAULT_BUCKET_CAPACITY)
        .by_capacity()
        .pinned(11),
    Spec::new(WINDOWS, Kind::LruHash, size_of::<BucketKey>(), size_of::<WindowState>(), DEFAULT_BUCKET_CAPACITY)
        .by_capacity()
        .pinned(14),
    Spec::new(FLEET, Kind::LruHash, size_of::<BucketKey>(), size_of::<WindowState>(), DEFAULT_BUCKET_CAPACITY)
        .by_capacity()
        .pinned(14),
    Spec::new(FLEET_STATE, Kind::Array, 4, 8, FleetSlot::COUNT).pinned(11),
    Spec::new(CONFIG, Kind::Array, 4, size_of::<Config>(), 2).pinned(11),
    Spec::new(ACTIVE, Kind::Array, 4, 4, 1).pinned(11),
    Spec::new(NEW_SOURCES, Kind::Array, 4, 8, 1).pinned(11),
    Spec::new(OVR4[0], Kind::LpmTrie, 8, 4, MAX_OVERRIDES).pinned(11),
    Spec::new(OVR4[1], Kind::LpmTrie, 8, 4, MAX_OVERRIDES).pinned(11),
    Spec::new(OVR6[0], Kind::LpmTrie, 20, 4, MAX_OVERRIDES).pinned(11),
    Spec::new(OVR6[1], Kind::LpmTrie, 20, 4, MAX_OVERRIDES).pinned(11),
    Spec::new(OVR_LIMITS, Kind::Array, 4, size_of::<ClassLimits>(), 2 * MAX_OVERRIDES).pinned(11),
    Spec::new(STATS, Kind::PerCpuArray, 4, size_of::<Counter>(), STAT_ENTRIES_U32).pinned(18),
    Spec::new(META, Kind::Array, 4, size_of::<Meta>(), 1).pinned(1),
    Spec::new(LAYOUT, Kind::Hash, 16, 4, LAYOUT_ENTRIES).pinned(11),
    Spec::new(RUNTIME, Kind::Hash, size_of::<RuntimeKey>(), size_of::<RuntimeOverride>(), MAX_OVERRIDES)
        .flags(NO_PREALLOC)
        .pinned(11),
    Spec::new(SYN_GUARD, Kind::Array, 4, size_of::<SynGuard>(), CLASSES_U32).pinned(11),
    Spec::new(DENY, Kind::Hash, size_of::<DenyKey>(), 4, MAX_DENIES).flags(NO_PREALLOC).pinned(15),
    Spec::new(DENY_LENS, Kind::Array, 4, size_of::<DenyLens>(), 2).pinned(15),
    Spec::new(DENY_HITS, Kind::PerCpuArray, 4, 8, MAX_ORIGINS).pinned(15),
    Spec::new(DENY_ORIGINS, Kind::Array, 4, size_of::<OriginName>(), MAX_ORIGINS).pinned(15),
    Spec::new(DENY_SOURCES, Kind::Array, 4, 8, 1).pinned(15),
    Spec::new(GROUPS4, Kind::LpmTrie, 8, 4, GROUP_NETWORKS).pinned(16),
    Spec::new(GROUPS6, Kind::LpmTrie, 12, 4, GROUP_NETWORKS).pinned(16),
    Spec::new(GROUP_LIMITS, Kind::Array, 4, size_of::<GroupLimits>(), 2 * MAX_GROUPS).pinned(16),
    Spec::new(GROUP_BUCKETS, Kind::Array, 4, 8, MAX_GROUPS).pinned(16),
    Spec::new(GROUP_HITS, Kind::PerCpuArray, 4, size_of::<GroupHits>(), MAX_GROUPS).pinned(17),
    Spec::new(
        TUNNEL_SERVICES,
        Kind::Hash,
        size_of::<tunnel::ServiceKey>(),
        size_of::<tunnel::Service>(),
        tunnel::SERVICE_PORTS,
    )
    .pinned(19),
    Spec::new(TUNNEL_TABLE, Kind::Array, 4, 4, tunnel::MAX_SERVICES * tunnel::TABLE_SIZE).pinned(19),
    Spec::new(TUNNEL_BACKENDS, Kind::Array, 4, size_of::<tunnel::Backend>(), tunnel::MAX_BACKENDS).pinned(19),
    Spec::new(TUNNEL_CONNS, Kind::LruHash, size_of::<tunnel::Flow>(), 4, tunnel::CONNECTIONS).pinned(19),
    Spec::new(TUNNEL_HITS, Kind::PerCpuArray, 4, size_of::<Counter>(), tunnel::MAX_BACKENDS).pinned(19),
    Spec::new(TUNNEL_OUTCOMES, Kind::PerCpuArray, 4, 8, tunnel::OUTCOMES).pinned(19),
    Spec::new(TOUCHED, Kind::RingBuf, 0, 0, TOUCHED_BYTES),
    Spec::new(TEST_CLOCK, Kind::Array, 4, 8, 1),
    Spec::new(DROP_EVENTS, Kind::RingBuf, 0, 0, DROP_EVENTS_BYTES),
    Spec::new(DROP_SAMPLER, Kind::PerCpuArray, 4, 8, 1),
    Spec::new(CAPTURES, Kind::RingBuf, 0, 0, CAPTURES_BYTES),
    Spec::new(CAPTURE, Kind::Array, 4, size_of::<CaptureCtl>(), 1),
    Spec::new(GLOBALS, Kind::Array, 4, 4, 1),
    Spec::new(CLOCK_CACHE, Kind::PerCpuArray, 4, size_of::<ClockCache>(), 1),
    Spec::new(CPU_SLOTS, Kind::PerCpuArray, 4, size_of::<CpuSlot>(), CPU_SLOTS_ENTRIES),
    Spec::new(KERNEL_SYNS, Kind::Array, 4, 8, REFRESH_SLOTS),
    Spec::new(OWN_ANSWERS, Kind::LruHash, size_of::<AnswerKey>(), 8, OWN_ANSWERS_ENTRIES),
    Spec::new(TCP_GUARD, Kind::Array, 4, size_of::<SynGuard>(), CLASSES_U32),
    Spec::new(TCP_HELD, Kind::PerCpuArray, 4, size_of::<crate::tcp_state::Held>(), crate::tcp_state::HELD_ENTRIES),
    Spec::new(TUNNEL_HOPS, Kind::PerCpuArray, 4, size_of::<tunnel::Hop>(), tunnel::MAX_BACKENDS),
    Spec::new(TUNNEL_FIB, Kind::PerCpuArray, 4, 64, 1),
];

/// The row of the map `name`; a name not in [`TABLE`] fails the build
/// where it is evaluated at compile time.
#[must_use]
pub const fn spec(name: &str) -> Spec {
    let mut i = 0;
    while i < TABLE.len() {
        if crate::same_name(TABLE[i].name, name) {
            return TABLE[i];
        }
        i += 1;
    }
    panic!("no such map in limiter_common::maps::TABLE")
}

/// How many rows of [`TABLE`] are pinned.
pub const PINNED: usize = {
    let (mut i, mut n) = (0, 0);
    while i < TABLE.len() {
        if TABLE[i].pinned.is_some() {
            n += 1;
        }
        i += 1;
    }
    n
};

/// Whether the program's declaration of `name` (aya type `ty`, declared
/// key and value sizes) is its row: checked at compile time by the
/// program's `map!`.
#[must_use]
pub const fn declared_as(name: &str, ty: &str, key: usize, value: usize) -> bool {
    let s = spec(name);
    crate::same_name(s.kind.aya_type(), ty) && s.kind.key_size(key) == s.key && value == s.value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_pinned_rows_come_first() {
        for (i, a) in TABLE.iter().enumerate() {
            assert!(TABLE[i + 1..].iter().all(|b| b.name != a.name), "{} twice", a.name);
            assert_eq!(a.pinned.is_some(), i < PINNED, "{}: pinned rows first", a.name);
            assert_eq!(spec(a.name), *a);
        }
    }
}
