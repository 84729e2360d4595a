//! What every packet leaves behind: one counter, of its class, reason and
//! family (per CPU, so no atomics in softirq), and for a 1-in-N sample of
//! drops an event for the top-offenders list.

use aya_ebpf::programs::XdpContext;
use aya_log_ebpf::debug;
use limiter_common::{BucketKey, Config, DropEvent, Reason, gcra, stat_index};

use crate::maps::{DROP_EVENTS, DROP_SAMPLER, STATS};

/// Count one packet of `len` bytes of `class` (or `UNCLASSIFIED`) under
/// `reason` and stat family `fam`; returns that counter's packets on this
/// CPU (so far, this one included).
#[inline(always)]
pub fn count(class: usize, reason: Reason, fam: u32, len: u64) -> u64 {
    let Some(c) = STATS.get_ptr_mut(stat_index(class, reason, fam)) else {
        return 0;
    };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        (*c).packets += 1;
        (*c).bytes += len;
        (*c).packets
    }
}

/// One in `drop_sample` drops (per CPU, class, reason and family: `seen`
/// is their counter's packets on this CPU) goes to the ring buffer for the
/// top-offenders list. Drop path only; the admit path pays nothing, and a
/// drop that is not sampled pays one test. A sampled drop is also logged
/// through aya-log, at debug level only (off unless the daemon runs with
/// debug logging) and at most once a second per CPU.
#[inline(always)]
pub fn sample_drop(ctx: &XdpContext, cfg: &Config, key: &BucketKey, reason: Reason, now: u64, seen: u64) {
    let every = u64::from(cfg.drop_sample);
    if every == 0 || seen & (every - 1) != 0 {
        return;
    }
    let _ = DROP_EVENTS.output(DropEvent { key: *key, reason: reason as u32 }, 0);
    let Some(last) = DROP_SAMPLER.get_ptr_mut(0) else { return };
    // SAFETY: per-CPU slot, only this CPU's softirq writes it.
    unsafe {
        if now.wrapping_sub(*last) >= gcra::to_fixed(gcra::NS_PER_S) {
            *last = now;
            debug!(
                ctx,
                "sampled drop: family {} /{} class {} reason {}", key.family, key.prefix_len, key.class, reason as u32
            );
        }
    }
}
