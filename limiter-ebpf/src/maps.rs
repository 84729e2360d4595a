//! Every map of the program. Capacities of `BUCKETS` are set by the loader.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use limiter_common::{
    BucketKey, BucketState, ClassCounters, ClassLimits, Config, Counter, MAX_CLASSES, Meta, REASON_COUNT, Refusal,
    RuntimeKey, RuntimeOverride, STAT_FAMILIES,
    maps::{DEFAULT_BUCKET_CAPACITY, DROP_EVENTS_BYTES, MAX_OVERRIDES, REFUSAL_SLOTS},
};

/// Written by: XDP (charging). Read by: XDP; userspace reads for status.
/// Shared by all CPUs so a prefix's allowance is never multiplied by the
/// CPU count; each entry is updated with one compare-and-swap.
#[map(name = "BUCKETS")]
pub static BUCKETS: LruHashMap<BucketKey, BucketState> = LruHashMap::with_max_entries(DEFAULT_BUCKET_CAPACITY, 0);

/// Written by: userspace (policy), always the inactive slot. Read by: XDP,
/// the slot `ACTIVE` names, once per packet.
#[map(name = "CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(2, 0);

/// Written by: userspace, after the new `CONFIG` slot is complete (one
/// 4-byte store: the atomic switch). Read by: XDP, once per packet.
#[map(name = "ACTIVE")]
pub static ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

/// Written by: XDP, per CPU, one slot per rule class. Read by: userspace.
#[map(name = "CLASS_STATS")]
pub static CLASS_STATS: PerCpuArray<ClassCounters> = PerCpuArray::with_max_entries(MAX_CLASSES as u32, 0);

/// Written by: XDP, per CPU, one slot per `Reason`. Read by: userspace,
/// summed over CPUs at read time. Per-CPU, so no atomics in softirq.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries((REASON_COUNT * STAT_FAMILIES) as u32, 0);

/// Written by: tests. Read by: the `limiter_test_clock` entry point only.
#[map(name = "TEST_CLOCK")]
pub static TEST_CLOCK: Array<u64> = Array::with_max_entries(1, 0);

/// Written by: userspace (on first pin). Read by: userspace, before it
/// re-adopts pinned maps. The program never touches it.
#[map(name = "META")]
pub static META: Array<Meta> = Array::with_max_entries(1, 0);

// Overrides, one trie per family per CONFIG slot. Written by: userspace,
// the idle slot only, before the ACTIVE flip. Read by: XDP, only when a
// bucket is created or the policy version changed.
#[map(name = "OVR4_0")]
pub static OVR4_0: LpmTrie<u32, u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0);
#[map(name = "OVR4_1")]
pub static OVR4_1: LpmTrie<u32, u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0);
#[map(name = "OVR6_0")]
pub static OVR6_0: LpmTrie<[u32; 4], u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0);
#[map(name = "OVR6_1")]
pub static OVR6_1: LpmTrie<[u32; 4], u32> = LpmTrie::with_max_entries(MAX_OVERRIDES, 0);

/// Written by: userspace, on every `limiter prefix` change. Read by:
/// userspace, at start, to put runtime overrides back. The program never
/// touches it; it is here so that it is pinned with the rest.
#[map(name = "RUNTIME")]
pub static RUNTIME: HashMap<RuntimeKey, RuntimeOverride> = HashMap::with_max_entries(MAX_OVERRIDES, BPF_F_NO_PREALLOC);

/// Written by: userspace, with the tries. Read by: XDP, per packet of a
/// bucket whose prefix has an override with its own rate.
#[map(name = "OVR_LIMITS")]
pub static OVR_LIMITS: Array<ClassLimits> = Array::with_max_entries(2 * MAX_OVERRIDES, 0);

/// Written by: XDP, one in `Config::drop_sample` drops, never blocking
/// (a full buffer loses the event). Read by: userspace, for `limiter top`.
#[map(name = "DROP_EVENTS")]
pub static DROP_EVENTS: RingBuf = RingBuf::with_byte_size(DROP_EVENTS_BYTES, 0);

/// Written and read by: XDP, per CPU: [0] drops seen, for 1-in-N
/// sampling; [1] time of the last debug log line, to rate-limit it.
#[map(name = "DROP_SAMPLER")]
pub static DROP_SAMPLER: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Written and read by: XDP, with compare-and-swap: the shared budget that
/// packets of prefixes without a bucket draw on. Userspace only pins it.
#[map(name = "NEW_SOURCES")]
pub static NEW_SOURCES: Array<u64> = Array::with_max_entries(1, 0);

/// Written and read by: XDP, per CPU: buckets seen refusing, and until
/// when (see `limiter_common::Refusal`). A flood of one prefix is dropped
/// from here without touching the shared bucket. Userspace never reads it.
#[map(name = "REFUSALS")]
pub static REFUSALS: PerCpuArray<Refusal> = PerCpuArray::with_max_entries(REFUSAL_SLOTS, 0);
