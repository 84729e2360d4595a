//! The bottom of the program's charging: a bounded compare-and-swap on a
//! map value's `u64`, an atomic add, and the two bucket steps built on the
//! first (a GCRA charge and its refund), shared by the charge, the per-CPU
//! leases, window quotas and the bench entry points.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd},
    ptr::read_volatile,
};

use limiter_common::{BucketState, Reason, gcra, reason::MAX_CAS_RETRIES};

/// One GCRA step applied with compare-and-swap, retried a bounded number of
/// times. CAS makes the update exact across CPUs: no race overshoot
/// (invariant 1).
#[inline(always)]
pub fn charge_existing(p: *mut BucketState, now: u64, inc: u64, tau: u64) -> Cas {
    // SAFETY: p points to a live map value.
    cas(unsafe { &raw mut (*p).tat }, |cur| gcra::admit(cur, now, inc, tau))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    Done,
    /// `step` returned `None` for the value seen: nothing was written.
    Refused(u64),
    /// Other CPUs won `MAX_CAS_RETRIES` races in a row.
    Contended,
}

/// Add `n` to `*p` atomically (BPF_ATOMIC_ADD: no retry needed).
#[inline(always)]
pub fn add(p: *mut u64, n: u64) {
    // SAFETY: callers pass a live map value; an atomic add on a map value
    // is verifier-approved.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, n) };
}

/// Replace `*p` with `step(*p)` atomically, retrying a bounded number of
/// times when another CPU changed it in between.
#[inline(always)]
pub fn cas(p: *mut u64, mut step: impl FnMut(u64) -> Option<u64>) -> Cas {
    for _ in 0..MAX_CAS_RETRIES {
        // An atomic load crashes the BPF backend; a volatile 8-byte load is
        // single-copy atomic on the BPF ISA, which is all we need here.
        // SAFETY: callers pass a live map value.
        let cur = unsafe { read_volatile(p) };
        let Some(new) = step(cur) else { return Cas::Refused(cur) };
        // SAFETY: as above; BPF_CMPXCHG on a map value is verifier-approved.
        let (_, swapped) =
            unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, cur, new) };
        if swapped {
            return Cas::Done;
        }
    }
    Cas::Contended
}

impl Cas {
    /// The reason a bucket charge gives.
    #[inline(always)]
    pub fn reason(self) -> Reason {
        match self {
            Cas::Done => Reason::Admitted,
            Cas::Refused(_) => Reason::RateLimited,
            Cas::Contended => Reason::Contended,
        }
    }
}

/// Give back a charge of `inc`: it was added to `tat` by this packet, so
/// `tat >= inc` and subtracting it returns exactly what was taken.
#[inline(always)]
pub fn refund(p: *mut BucketState, inc: u64) {
    // SAFETY: p points to a live map value.
    refund_tat(unsafe { &raw mut (*p).tat }, inc);
}

/// [`refund`] of a bare `tat` (a group's budget).
#[inline(always)]
pub fn refund_tat(tat: *mut u64, inc: u64) {
    let _ = cas(tat, |cur| Some(cur.saturating_sub(inc)));
}
