//! Every map of the program. Capacities of `BUCKETS` are set by the loader.

use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use limiter_common::{
    BucketKey, BucketState, ClassCounters, Config, Counter, MAX_CLASSES, Meta, REASON_COUNT,
    maps::DEFAULT_BUCKET_CAPACITY,
};

/// Written by: XDP (charging). Read by: XDP; userspace reads for status.
/// Shared by all CPUs so a prefix's allowance is never multiplied by the
/// CPU count; each entry is updated with one compare-and-swap.
#[map(name = "BUCKETS")]
pub static BUCKETS: LruHashMap<BucketKey, BucketState> =
    LruHashMap::with_max_entries(DEFAULT_BUCKET_CAPACITY, 0);

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
pub static CLASS_STATS: PerCpuArray<ClassCounters> =
    PerCpuArray::with_max_entries(MAX_CLASSES as u32, 0);

/// Written by: XDP, per CPU, one slot per `Reason`. Read by: userspace,
/// summed over CPUs at read time. Per-CPU, so no atomics in softirq.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(REASON_COUNT as u32, 0);

/// Written by: tests. Read by: the `limiter_test_clock` entry point only.
#[map(name = "TEST_CLOCK")]
pub static TEST_CLOCK: Array<u64> = Array::with_max_entries(1, 0);

/// Written by: userspace (on first pin). Read by: userspace, before it
/// re-adopts pinned maps. The program never touches it.
#[map(name = "META")]
pub static META: Array<Meta> = Array::with_max_entries(1, 0);
