//! A fleet prefix's share of what the moving window frees between two
//! syncs: what a sync writes to the program's `FLEET` map besides the
//! other nodes' counts. Pure arithmetic, no I/O, tested on its own.

use limiter_common::window::{self, WindowState};

use super::ledger::{others, unstored};

/// When a sync falls in a prefix's class: its current slice, the position
/// in it and the sync interval (both in 1/4096 of a slice), and the
/// window's slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    pub cur: u64,
    pub here: u64,
    pub interval: u64,
    pub slices: u32,
}

impl Moment {
    /// The moment `wall_ns` in a class of `slices` slices of `slice_ns`,
    /// synced every `interval_ns`.
    #[must_use]
    pub fn at(wall_ns: u64, slice_ns: u64, interval_ns: u64, slices: u32) -> Self {
        let slice_ns = slice_ns.max(1);
        let positions = |ns: u64| {
            u64::try_from(u128::from(ns) * (1u128 << window::POSITION_BITS) / u128::from(slice_ns)).unwrap_or(u64::MAX)
        };
        Self { cur: wall_ns / slice_ns, here: positions(wall_ns % slice_ns), interval: positions(interval_ns), slices }
    }
}

/// A prefix's share applies before any refusal once the fleet admits
/// more than 1/`FAST` of its limit per sync interval: the most a sync's
/// delay can let through then is one interval's admissions, so without
/// it that is at most 1/`FAST` of the limit too much.
pub const FAST: u64 = 20;

/// What a sync writes to the program's `FLEET` map for a prefix: the
/// other nodes' counts ([`others`]) and the share of what is freed until
/// the next sync ([`share`]).
#[must_use]
pub fn view(reads: &[(usize, u64)], values: &[u64], local: &WindowState, at: Moment, limit: u64) -> WindowState {
    let mut v = others(reads, values, at.cur, at.slices, limit);
    v.share = share(reads, values, local, at, limit);
    v
}

/// Between two syncs every node sees the budget the moving window frees,
/// and each would spend all of it: a prefix flooding every node gets up
/// to one interval's arrivals past its limit. The share has each node
/// count the others' admissions since the sync as a factor of its own (in
/// 1/256): the others' admissions in the current and previous slice per
/// one of its own there, at most one per other node admitting there (as
/// if each did as it does; exactly that when it admitted none there). It
/// applies once the node has refused the prefix (the program's mark), or
/// from this sync on when the fleet admits the prefix fast ([`FAST`]):
/// a compliant client is judged on the counts alone unless it spends
/// more than 1/`FAST` of its limit in one interval across several nodes.
#[must_use]
pub fn share(reads: &[(usize, u64)], values: &[u64], local: &WindowState, at: Moment, limit: u64) -> u64 {
    let recent = |s: u64| s + 1 >= at.cur && s <= at.cur;
    let mut peers: Vec<usize> = Vec::new();
    let mut theirs = 0u64;
    // Per slice (previous, current): the fleet's count and its earliest
    // first admission.
    let mut pace = [(0u64, window::PAST_THE_SLICE), (0u64, window::PAST_THE_SLICE)];
    let mut count = |slice: usize, n: u64, first: u64| {
        pace[slice].0 = pace[slice].0.saturating_add(n);
        pace[slice].1 = pace[slice].1.min(first);
    };
    for ((p, s), v) in reads.iter().zip(values) {
        let (n, first) = unstored(*v);
        if n > 0 && recent(*s) {
            theirs = theirs.saturating_add(n);
            if !peers.contains(p) {
                peers.push(*p);
            }
            count(usize::from(*s == at.cur), n, first);
        }
    }
    let mut mine = 0u64;
    for s in local.slots.iter().filter(|s| window::count(**s) > 0 && window::age(**s, at.cur) <= 1) {
        mine += window::count(*s);
        count(usize::from(window::age(*s, at.cur) == 0), window::count(*s), window::first(*s));
    }
    let most = (peers.len() as u64) << window::SHARE_SHIFT;
    let factor = theirs.saturating_mul(1 << window::SHARE_SHIFT).checked_div(mine).map_or(most, |f| f.min(most));
    // The fleet's admissions per interval since the first admission of the
    // current slice, or of the previous one with it (at least one
    // interval): the faster.
    let slice = 1u64 << window::POSITION_BITS;
    let per_interval = |n: u64, from: u64| {
        let span = from.max(at.interval).max(1);
        u64::try_from(u128::from(n) * u128::from(at.interval) / u128::from(span)).unwrap_or(u64::MAX)
    };
    let [(before, first_before), (now, first_now)] = pace;
    let pace = per_interval(now, at.here.saturating_sub(first_now.min(at.here)))
        .max(per_interval(now + before, (at.here + slice).saturating_sub(first_before.min(slice))));
    window::share(factor, 0, pace.saturating_mul(FAST) > limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::ledger::{stored, tests::state};

    #[test]
    fn a_share_counts_the_others_per_admission_here_and_applies_early_only_to_a_fast_prefix() {
        // Slice 5 s, sync every 0.2 s (163 of 4096), half-way into slice 77.
        let at = Moment::at(77 * 5_000_000_000 + 2_500_000_000, 5_000_000_000, 200_000_000, 12);
        assert_eq!((at.cur, at.here, at.interval), (77, 2048, 163));
        let v = |n: u64, first: u64| stored(n, Some(first));
        let factor = |s: u64| (s & !window::SHARE_NOW) >> 32;
        // Three peers, 40 this slice, first at 2000; 20 here, first at
        // 2040: 60 in 48/4096 of a slice, fast for a limit of 600.
        let reads = [(0, 77), (1, 77), (2, 77)];
        let local = state(&[]);
        let mut here = local;
        here.slots[window::slot_of(77, 12)] = window::slot(77, 2040, 20);
        let s = share(&reads, &[v(10, 2000), v(10, 2000), v(20, 2000)], &here, at, 600);
        assert_eq!(factor(s), 2 << window::SHARE_SHIFT, "40 there per 20 here");
        assert!(s & window::SHARE_NOW != 0, "60 in less than an interval: fast");
        assert_eq!(window::others_since(s | 4), 8, "4 admissions here: 8 estimated there");
        // More since the start of the slice: 100 in 12 intervals.
        let slow = share(&reads, &[v(30, 0); 3], &state(&[(77, 10)]), at, 600);
        assert_eq!(slow & window::SHARE_NOW, 0, "about 8 an interval: judged on the counts alone");
        assert_eq!(factor(slow), 3 << window::SHARE_SHIFT, "90 there per 10 here: one per peer at most");
        // A peer far busier than its share counts for one node each; none
        // here: as many as there are peers.
        let s = share(&reads, &[v(3000, 0), v(30, 0), v(30, 0)], &state(&[(77, 1)]), at, 600);
        assert_eq!(factor(s), 3 << window::SHARE_SHIFT);
        assert_eq!(factor(share(&reads, &[v(30, 0); 3], &local, at, 600)), 3 << window::SHARE_SHIFT);
        // Alone in the fleet: nothing to share.
        assert_eq!(factor(share(&[], &[], &here, at, 600)), 0);
        // A burst across the slice boundary is still fast (the previous
        // slice with the current one).
        let early = Moment { here: 40, ..at };
        let s = share(&[(0, 76), (0, 77)], &[v(80, 4090), v(5, 0)], &state(&[(77, 5)]), early, 600);
        assert!(s & window::SHARE_NOW != 0);
    }
}
