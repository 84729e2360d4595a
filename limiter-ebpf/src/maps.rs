//! Every map of the program, each with who writes and who reads it,
//! declared from its row of `limiter_common::maps::TABLE` by [`map!`]:
//! the symbol is the map's name in the object, entries and flags are the
//! row's, and the build fails if the declared kind, key or value differs
//! from it. Capacities of `BUCKETS`, `WINDOWS` and `FLEET` are set by the
//! loader.

use core::mem::size_of;

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use limiter_common::{
    AnswerKey, BucketKey, BucketState, ClassLimits, ClockCache, Config, Counter, Meta, RuntimeKey, RuntimeOverride,
    capture::CaptureCtl,
    cookie::SynGuard,
    deny::{DenyKey, DenyLens, OriginName},
    groups::{GroupHits, GroupLimits},
    lease::CpuSlot,
    maps,
    window::WindowState,
};

/// `bpf_map_update_elem`'s flag: create the entry only if it is absent.
pub const BPF_NOEXIST: u64 = 1;

/// A map declared from its row of `limiter_common::maps::TABLE` (the
/// symbol is the map's name): entries and flags come from the row, and
/// the build fails unless the declared kind, key and value are the row's.
macro_rules! map {
    ($(#[$doc:meta])* $sym:ident: RingBuf) => {
        $(#[$doc])*
        #[map]
        pub static $sym: RingBuf =
            RingBuf::with_byte_size(maps::spec(stringify!($sym)).entries, maps::spec(stringify!($sym)).flags);
        const _: () = assert!(maps::declared_as(stringify!($sym), "RingBuf", 0, 0), "differs from maps::TABLE");
    };
    ($(#[$doc:meta])* $sym:ident: $kind:ident<$k:ty, $v:ty>) => {
        $(#[$doc])*
        #[map]
        pub static $sym: $kind<$k, $v> = <$kind<$k, $v>>::with_max_entries(
            maps::spec(stringify!($sym)).entries,
            maps::spec(stringify!($sym)).flags,
        );
        const _: () = assert!(
            maps::declared_as(stringify!($sym), stringify!($kind), size_of::<$k>(), size_of::<$v>()),
            "differs from maps::TABLE"
        );
    };
    // Arrays: the key is a u32 index.
    ($(#[$doc:meta])* $sym:ident: $kind:ident<$v:ty>) => {
        $(#[$doc])*
        #[map]
        pub static $sym: $kind<$v> =
            <$kind<$v>>::with_max_entries(maps::spec(stringify!($sym)).entries, maps::spec(stringify!($sym)).flags);
        const _: () = assert!(
            maps::declared_as(stringify!($sym), stringify!($kind), size_of::<u32>(), size_of::<$v>()),
            "differs from maps::TABLE"
        );
    };
}

map! {
    /// Written by: XDP (charging). Read by: XDP; userspace reads for status.
    /// Shared by all CPUs so a prefix's allowance is never multiplied by the
    /// CPU count; each entry is updated with one compare-and-swap.
    BUCKETS: LruHashMap<BucketKey, BucketState>
}

map! {
    /// Written by: XDP (window quotas), each slot with one compare-and-swap
    /// from any CPU. Read by: XDP; userspace reads for fleet sync and
    /// `prefix show`. Capacity set by the loader, as `BUCKETS`.
    WINDOWS: LruHashMap<BucketKey, WindowState>
}

map! {
    /// Written by: userspace (fleet sync): the other nodes' slice counts of
    /// fleet-scope prefixes. Read by: XDP, for fleet-scope window quotas.
    FLEET: LruHashMap<BucketKey, WindowState>
}

map! {
    /// Written by: userspace: the sync epoch, the split divisor while the
    /// store is down, the wall clock's offset. Read by: XDP, for window
    /// quotas.
    FLEET_STATE: Array<u64>
}

map! {
    /// Written by: XDP, a fleet-scope prefix's first packet in each epoch,
    /// never blocking (a full buffer loses the event and the next sync
    /// reads what it knows). Read by: userspace, the fleet sync.
    TOUCHED: RingBuf
}

map! {
    /// Written by: userspace (policy), always the inactive slot. Read by: XDP,
    /// the slot `ACTIVE` names, once per packet.
    CONFIG: Array<Config>
}

map! {
    /// Written by: userspace, after the new `CONFIG` slot is complete (one
    /// 4-byte store: the atomic switch). Read by: XDP, once per packet.
    ACTIVE: Array<u32>
}

map! {
    /// Written by: XDP, per CPU, one slot per class, `Reason` and stat
    /// family. Read by: userspace, summed over CPUs at read time. Per-CPU,
    /// so no atomics in softirq.
    STATS: PerCpuArray<Counter>
}

map! {
    /// Written by: tests. Read by: the `limiter_test_clock` entry point only.
    TEST_CLOCK: Array<u64>
}

map! {
    /// Written by: userspace (on first pin). Read by: userspace, before it
    /// re-adopts pinned maps. The program never touches it.
    META: Array<Meta>
}

map! {
    /// Written by: userspace, once the program is on the link. Read by:
    /// userspace, an older build rolling back. The program never touches it.
    LAYOUT: HashMap<[u8; 16], u32>
}

// Overrides, one trie per family per CONFIG slot. Written by: userspace,
// the idle slot only, before the ACTIVE flip. Read by: XDP, only when a
// bucket is created or the policy version changed.
map! {
    OVR4_0: LpmTrie<u32, u32>
}
map! {
    OVR4_1: LpmTrie<u32, u32>
}
map! {
    OVR6_0: LpmTrie<[u32; 4], u32>
}
map! {
    OVR6_1: LpmTrie<[u32; 4], u32>
}

map! {
    /// Written by: userspace, on every `limiter prefix` change. Read by:
    /// userspace, at start, to put runtime overrides back. The program never
    /// touches it; it is here so that it is pinned with the rest.
    RUNTIME: HashMap<RuntimeKey, RuntimeOverride>
}

map! {
    /// Written by: userspace, with the tries. Read by: XDP, per packet of a
    /// bucket whose prefix has an override with its own rate.
    OVR_LIMITS: Array<ClassLimits>
}

map! {
    /// Written by: XDP, one in `Config::drop_sample` drops at random, never blocking
    /// (a full buffer loses the event). Read by: userspace, for `limiter top`.
    DROP_EVENTS: RingBuf
}

map! {
    /// Written by: XDP, a copy of each frame drawn while `CAPTURE` is on,
    /// never blocking (a full buffer loses the frame). Read by: userspace,
    /// for `limiter capture` and the attacks' pcaps.
    CAPTURES: RingBuf
}

map! {
    /// Written by: userspace, while a capture or an attack's pcap wants
    /// frames. Read by: XDP, per drop.
    CAPTURE: Array<CaptureCtl>
}

map! {
    /// Written and read by: XDP, per CPU: the time of the last debug log
    /// line of a sampled drop, to rate-limit it. (Which drops are sampled
    /// is drawn at random for each.)
    DROP_SAMPLER: PerCpuArray<u64>
}

map! {
    /// Written and read by: XDP, per CPU: the coarse clock as read in the
    /// current jiffy (see `limiter_common::ClockCache`). Userspace never
    /// reads it.
    CLOCK_CACHE: PerCpuArray<ClockCache>
}

map! {
    /// Written and read by: XDP, with compare-and-swap: the shared budget that
    /// packets of prefixes without a bucket draw on. Userspace only pins it.
    NEW_SOURCES: Array<u64>
}

map! {
    /// Written and read by: XDP, per CPU: leases of buckets' credit, and
    /// buckets seen refusing until a known time (see
    /// `limiter_common::lease`). A busy prefix is admitted, and a flood of
    /// one dropped, from here without touching the shared bucket. Other
    /// CPUs only zero an entry's credit, before they refuse a packet.
    /// Userspace never reads it.
    CPU_SLOTS: PerCpuArray<CpuSlot>
}

map! {
    /// Written by: XDP, the `auto` SYN cookie trigger of each class (see
    /// `limiter_common::cookie::SynGuard`). Read by: XDP; userspace reads
    /// whether a class's cookies are engaged.
    SYN_GUARD: Array<SynGuard>
}

map! {
    /// Written and read by: XDP: when a SYN to each port (per family) was
    /// last handed to the kernel's own cookie path. Userspace never reads it.
    KERNEL_SYNS: Array<u64>
}

map! {
    /// Written by: userspace, entry by entry (adds before removes, then
    /// `ACTIVE`'s change count moves). Read by: XDP, when a bucket
    /// resolves, and per packet of a bucket with a finer marker.
    DENY: HashMap<DenyKey, u32>
}

map! {
    /// Written by: userspace, before the networks of a new length and
    /// after the last of one goes. Read by: XDP, with `DENY`.
    DENY_LENS: Array<DenyLens>
}

map! {
    /// Written by: XDP, per CPU, a packet the deny set drops, under its
    /// origin. Read by: userspace, summed over CPUs, for the metrics.
    DENY_HITS: PerCpuArray<u64>
}

map! {
    /// Written and read by: userspace only (origins' names, pinned so a
    /// restarted daemon knows who denied what).
    DENY_ORIGINS: Array<OriginName>
}

map! {
    /// Written and read by: XDP, with compare-and-swap: the budget under
    /// which a denied prefix gets a bucket (caching its denial).
    DENY_SOURCES: Array<u64>
}

map! {
    /// Written by: userspace, entry by entry (then `ACTIVE`'s change count
    /// moves). Read by: XDP, when a bucket resolves.
    GROUPS4: LpmTrie<u32, u32>
}

map! {
    /// As `GROUPS4`, for IPv6 (the top 64 bits).
    GROUPS6: LpmTrie<[u32; 2], u32>
}

map! {
    /// Written by: userspace, into the `CONFIG` slot not in use, with the
    /// policy. Read by: XDP, when a bucket resolves and per packet of a
    /// group.
    GROUP_LIMITS: Array<GroupLimits>
}

map! {
    /// Written and read by: XDP, with compare-and-swap: each group's
    /// shared budget.
    GROUP_BUCKETS: Array<u64>
}

map! {
    /// Written by: XDP, per CPU, each packet of a group. Read by:
    /// userspace, summed over CPUs, for the metrics.
    GROUP_HITS: PerCpuArray<GroupHits>
}

map! {
    /// Written by: XDP (an own answer charged to its socket's budget).
    /// Read by: XDP. Program only, never pinned: a restart starts each
    /// socket's budget full, which is one burst.
    OWN_ANSWERS: LruHashMap<AnswerKey, u64>
}

map! {
    /// Written by: XDP (the out-of-state check's `auto` trigger), from any
    /// CPU without atomics. Read by: XDP; userspace, to report whether a
    /// class's check is engaged. Program only: a restart releases it until
    /// the next flood trips it again.
    TCP_GUARD: Array<SynGuard>
}

map! {
    /// Written and read by: XDP, per CPU: the connections the kernel's
    /// socket tables were found to hold, direct-mapped by their 4-tuple.
    /// Program only: a restart asks the kernel again.
    TCP_HELD: PerCpuArray<limiter_common::tcp_state::Held>
}

map! {
    /// Written by: userspace, with the policy. Read by: XDP, per packet the
    /// limiter passes while the policy forwards some destination.
    TUNNEL_SERVICES: HashMap<limiter_common::tunnel::ServiceKey, limiter_common::tunnel::Service>
}

map! {
    /// Written by: userspace (each service's Maglev table, again when a
    /// backend goes down, up, or is drained). Read by: XDP, per new flow.
    TUNNEL_TABLE: Array<u32>
}

map! {
    /// Written by: userspace (addresses, health, drains). Read by: XDP,
    /// per forwarded packet.
    TUNNEL_BACKENDS: Array<limiter_common::tunnel::Backend>
}

map! {
    /// Written and read by: XDP (a flow's backend, on its first packet).
    /// Program only: a restart forgets which backend each flow had, and a
    /// pool unchanged since sends each to the same one again.
    TUNNEL_CONNS: LruHashMap<limiter_common::tunnel::Flow, u32>
}

map! {
    /// Written by: XDP, per CPU (a backend's next hop, looked up again
    /// after `HOP_JIFFIES`); userspace clears it when it writes the
    /// backends. Read by: XDP, per forwarded packet.
    TUNNEL_HOPS: PerCpuArray<limiter_common::tunnel::Hop>
}

map! {
    /// Written and read by: XDP, per CPU: a next hop's lookup parameters
    /// (`bpf_fib_lookup`'s 64 bytes, off the stack).
    TUNNEL_FIB: PerCpuArray<[u64; 8]>
}

map! {
    /// Written by: XDP, per CPU, per forwarded packet. Read by: userspace,
    /// summed, for the metrics.
    TUNNEL_HITS: PerCpuArray<Counter>
}

map! {
    /// Written by: XDP, per CPU: a service's packets not forwarded, by
    /// outcome. Read by: userspace.
    TUNNEL_OUTCOMES: PerCpuArray<u64>
}
