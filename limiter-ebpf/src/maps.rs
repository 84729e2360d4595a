//! Every map of the program, each with who writes and who reads it. The
//! symbol of each map is its name in the object; [`map!`] checks at compile
//! time that it is spelled as in `limiter_common::maps`, so a typo fails the
//! build instead of showing at run time as a missing map. Capacities of
//! `BUCKETS` are set by the loader.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use limiter_common::{
    BucketKey, BucketState, ClassLimits, ClockCache, Config, Counter, MAX_CLASSES, Meta, RuntimeKey, RuntimeOverride,
    STAT_ENTRIES,
    cookie::{REFRESH_SLOTS, SynGuard},
    lease::CpuSlot,
    maps::{self, CPU_SLOTS_ENTRIES, DEFAULT_BUCKET_CAPACITY, DROP_EVENTS_BYTES, MAX_OVERRIDES, TOUCHED_BYTES},
    window::{FleetSlot, WindowState},
};

/// `bpf_map_update_elem`'s flag: create the entry only if it is absent.
pub const BPF_NOEXIST: u64 = 1;

/// A map whose symbol must equal `$name` of `limiter_common::maps`.
macro_rules! map {
    ($(#[$doc:meta])* $sym:ident = $name:expr; $ty:ty = $init:expr) => {
        $(#[$doc])*
        #[map]
        pub static $sym: $ty = $init;
        const _: () = assert!(limiter_common::same_name($name, stringify!($sym)), "map symbol differs from limiter_common::maps");
    };
}

map! {
    /// Written by: XDP (charging). Read by: XDP; userspace reads for status.
    /// Shared by all CPUs so a prefix's allowance is never multiplied by the
    /// CPU count; each entry is updated with one compare-and-swap.
    BUCKETS = maps::BUCKETS;
    LruHashMap<BucketKey, BucketState> = LruHashMap::with_max_entries(DEFAULT_BUCKET_CAPACITY, 0)
}

map! {
    /// Written by: XDP (window quotas), each slot with one compare-and-swap
    /// from any CPU. Read by: XDP; userspace reads for fleet sync and
    /// `prefix show`. Capacity set by the loader, as `BUCKETS`.
    WINDOWS = maps::WINDOWS;
    LruHashMap<BucketKey, WindowState> = LruHashMap::with_max_entries(DEFAULT_BUCKET_CAPACITY, 0)
}

map! {
    /// Written by: userspace (fleet sync): the other nodes' slice counts of
    /// fleet-scope prefixes. Read by: XDP, for fleet-scope window quotas.
    FLEET = maps::FLEET;
    LruHashMap<BucketKey, WindowState> = LruHashMap::with_max_entries(DEFAULT_BUCKET_CAPACITY, 0)
}

map! {
    /// Written by: userspace: the sync epoch, the split divisor while the
    /// store is down, the wall clock's offset. Read by: XDP, for window
    /// quotas.
    FLEET_STATE = maps::FLEET_STATE;
    Array<u64> = Array::with_max_entries(FleetSlot::COUNT, 0)
}

map! {
    /// Written by: XDP, a fleet-scope prefix's first packet in each epoch,
    /// never blocking (a full buffer loses the event and the next sync
    /// reads what it knows). Read by: userspace, the fleet sync.
    TOUCHED = maps::TOUCHED;
    RingBuf = RingBuf::with_byte_size(TOUCHED_BYTES, 0)
}

map! {
    /// Written by: userspace (policy), always the inactive slot. Read by: XDP,
    /// the slot `ACTIVE` names, once per packet.
    CONFIG = maps::CONFIG;
    Array<Config> = Array::with_max_entries(2, 0)
}

map! {
    /// Written by: userspace, after the new `CONFIG` slot is complete (one
    /// 4-byte store: the atomic switch). Read by: XDP, once per packet.
    ACTIVE = maps::ACTIVE;
    Array<u32> = Array::with_max_entries(1, 0)
}

map! {
    /// Written by: XDP, per CPU, one slot per class, `Reason` and stat
    /// family. Read by: userspace, summed over CPUs at read time. Per-CPU,
    /// so no atomics in softirq.
    #[expect(clippy::cast_possible_truncation, reason = "a small constant")]
    STATS = maps::STATS;
    PerCpuArray<Counter> = PerCpuArray::with_max_entries(STAT_ENTRIES as u32, 0)
}

map! {
    /// Written by: tests. Read by: the `limiter_test_clock` entry point only.
    TEST_CLOCK = maps::TEST_CLOCK;
    Array<u64> = Array::with_max_entries(1, 0)
}

map! {
    /// Written by: userspace (on first pin). Read by: userspace, before it
    /// re-adopts pinned maps. The program never touches it.
    META = maps::META;
    Array<Meta> = Array::with_max_entries(1, 0)
}

map! {
    /// Written by: userspace, once the program is on the link. Read by:
    /// userspace, an older build rolling back. The program never touches it.
    LAYOUT = maps::LAYOUT;
    HashMap<[u8; 16], u32> = HashMap::with_max_entries(maps::LAYOUT_ENTRIES, 0)
}

// Overrides, one trie per family per CONFIG slot. Written by: userspace,
// the idle slot only, before the ACTIVE flip. Read by: XDP, only when a
// bucket is created or the policy version changed.
map! {
    OVR4_0 = maps::OVR4[0];
    LpmTrie<u32, u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0)
}
map! {
    OVR4_1 = maps::OVR4[1];
    LpmTrie<u32, u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0)
}
map! {
    OVR6_0 = maps::OVR6[0];
    LpmTrie<[u32; 4], u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0)
}
map! {
    OVR6_1 = maps::OVR6[1];
    LpmTrie<[u32; 4], u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0)
}

map! {
    /// Written by: userspace, on every `limiter prefix` change. Read by:
    /// userspace, at start, to put runtime overrides back. The program never
    /// touches it; it is here so that it is pinned with the rest.
    RUNTIME = maps::RUNTIME;
    HashMap<RuntimeKey, RuntimeOverride> = HashMap::with_max_entries(MAX_OVERRIDES, BPF_F_NO_PREALLOC)
}

map! {
    /// Written by: userspace, with the tries. Read by: XDP, per packet of a
    /// bucket whose prefix has an override with its own rate.
    OVR_LIMITS = maps::OVR_LIMITS;
    Array<ClassLimits> = Array::with_max_entries(2 * MAX_OVERRIDES, 0)
}

map! {
    /// Written by: XDP, one in `Config::drop_sample` drops, never blocking
    /// (a full buffer loses the event). Read by: userspace, for `limiter top`.
    DROP_EVENTS = maps::DROP_EVENTS;
    RingBuf = RingBuf::with_byte_size(DROP_EVENTS_BYTES, 0)
}

map! {
    /// Written and read by: XDP, per CPU: the time of the last debug log
    /// line of a sampled drop, to rate-limit it. (Which drops are sampled
    /// follows their counters in `STATS`.)
    DROP_SAMPLER = maps::DROP_SAMPLER;
    PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0)
}

map! {
    /// Written and read by: XDP, per CPU: the coarse clock as read in the
    /// current jiffy (see `limiter_common::ClockCache`). Userspace never
    /// reads it.
    CLOCK_CACHE = maps::CLOCK_CACHE;
    PerCpuArray<ClockCache> = PerCpuArray::with_max_entries(1, 0)
}

map! {
    /// Written and read by: XDP, with compare-and-swap: the shared budget that
    /// packets of prefixes without a bucket draw on. Userspace only pins it.
    NEW_SOURCES = maps::NEW_SOURCES;
    Array<u64> = Array::with_max_entries(1, 0)
}

map! {
    /// Written and read by: XDP, per CPU: leases of buckets' credit, and
    /// buckets seen refusing until a known time (see
    /// `limiter_common::lease`). A busy prefix is admitted, and a flood of
    /// one dropped, from here without touching the shared bucket. Other
    /// CPUs only zero an entry's credit, before they refuse a packet.
    /// Userspace never reads it.
    CPU_SLOTS = maps::CPU_SLOTS;
    PerCpuArray<CpuSlot> = PerCpuArray::with_max_entries(CPU_SLOTS_ENTRIES, 0)
}

map! {
    /// Written by: XDP, the `auto` SYN cookie trigger of each class (see
    /// `limiter_common::cookie::SynGuard`). Read by: XDP; userspace reads
    /// whether a class's cookies are engaged.
    #[expect(clippy::cast_possible_truncation, reason = "a small constant")]
    SYN_GUARD = maps::SYN_GUARD;
    Array<SynGuard> = Array::with_max_entries(MAX_CLASSES as u32, 0)
}

map! {
    /// Written and read by: XDP: when a SYN to each port (per family) was
    /// last handed to the kernel's own cookie path. Userspace never reads it.
    KERNEL_SYNS = maps::KERNEL_SYNS;
    Array<u64> = Array::with_max_entries(REFRESH_SLOTS, 0)
}
