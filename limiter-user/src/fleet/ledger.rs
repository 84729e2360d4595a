//! What this node has told the store, and what the store told it back:
//! pure bookkeeping, no I/O, so it is tested on its own.
//!
//! For each fleet-scope prefix with packets since the last sync (the
//! program's touch events name them, so the map is never walked), the
//! local slice counts are compared with what was last pushed: the
//! difference is this sync's delta per slice. The store keeps one total
//! per (prefix, slice) for the whole fleet; the other nodes' count of a
//! slice is that total less what this node pushed to it.

use std::collections::{HashMap, HashSet};

use limiter_common::{
    BucketKey,
    window::{self, SLOTS, WindowState},
};

/// Prefixes remembered at most (pushed counts and pending touches each);
/// more are not synced (and counted), so memory stays bounded under a
/// spoofed flood of a fleet class.
pub const MAX_PREFIXES: usize = 1 << 20;

/// The full slice number of `slot`, `cur` being the current slice.
#[must_use]
pub fn full_slice(slot: u64, cur: u64) -> u64 {
    cur.wrapping_sub(window::age(slot, cur))
}

/// The slots of `w` inside the window ending in slice `cur` or leaving
/// it, as (full slice, count, position of its first admission), oldest
/// first.
#[must_use]
pub fn slices_of(w: &WindowState, cur: u64, slices: u32) -> Vec<(u64, u64, u64)> {
    let mut v: Vec<(u64, u64, u64)> = w
        .slots
        .iter()
        .filter(|s| window::count(**s) > 0 && window::age(**s, cur) <= u64::from(slices))
        .map(|s| (full_slice(*s, cur), window::count(*s), window::first(*s)))
        .collect();
    v.sort_unstable();
    v
}

/// A store value: the count of a node's slice, and in the bits above 32
/// the position of its first admission (added once, with the slice's
/// first push: later pushes add counts only).
#[must_use]
pub const fn stored(count: u64, first: Option<u64>) -> u64 {
    match first {
        Some(f) => (f << 32) | count,
        None => count,
    }
}

/// A store value read back: (count, position of the slice's first
/// admission), as [`stored`] wrote them.
#[must_use]
pub const fn unstored(value: u64) -> (u64, u64) {
    (value & 0xffff_ffff, (value >> 32) & ((1 << window::POSITION_BITS) - 1))
}

/// The other nodes' counts of a prefix's window ending in slice `cur`,
/// from what was read of their fields: `reads[i]` is (peer, slice on this
/// node's clock) of `values[i]` (see [`stored`]). Only the slices of the
/// window, the one leaving it (with the earliest first admission of any
/// peer), and one slice ahead (for clocks a little ahead) count, and each
/// peer's share of the window is clamped at `limit` (its slices summed
/// oldest first; what passes the limit is not counted; the leaving slice
/// on its own): a peer, or a writer to the store in its name, can never
/// count for more than one node at its limit could.
#[must_use]
pub fn others(reads: &[(usize, u64)], values: &[u64], cur: u64, slices: u32, limit: u64) -> WindowState {
    let leaving = cur.saturating_sub(u64::from(slices));
    let mut seen: Vec<(usize, u64, u64, u64)> = reads
        .iter()
        .zip(values)
        .map(|((p, s), v)| {
            let (n, first) = unstored(*v);
            (*p, *s, n, first)
        })
        .filter(|(_, s, n, _)| (leaving..=cur + 1).contains(s) && *n > 0)
        .collect();
    seen.sort_unstable();
    // (slice, count, earliest first admission)
    let mut per_slice: Vec<(u64, u64, u64)> = Vec::new();
    let mut peer = usize::MAX;
    let mut left = 0;
    for (p, s, n, first) in seen {
        if p != peer {
            (peer, left) = (p, limit);
        }
        let n = if s == leaving && slices > 0 {
            n.min(limit)
        } else {
            let n = n.min(left);
            left -= n;
            n
        };
        match per_slice.iter_mut().find(|(x, _, _)| *x == s) {
            Some((_, total, f)) => {
                *total = total.saturating_add(n);
                *f = (*f).min(first);
            }
            None => per_slice.push((s, n, first)),
        }
    }
    let mut out = WindowState::default();
    for (s, n, first) in per_slice {
        let i = window::slot_of(s, slices);
        // The slot of the slice ahead is the leaving one's: that one wins
        // (the program counts the slice ahead only once it is current).
        if i < SLOTS && n > 0 && s <= cur {
            out.slots[i] = window::slot(s, first, n.min(u64::from(u32::MAX)));
        }
    }
    out
}

/// This node's sync bookkeeping.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Local counts as last pushed, per prefix.
    pushed: HashMap<BucketKey, WindowState>,
    /// Prefixes touched since their last successful push.
    pending: HashSet<BucketKey>,
    /// Prefixes whose fleet count was at least half their limit at the
    /// last sync: read back every sync even without packets here, so a
    /// node whose share of a flooding client is sparse does not judge its
    /// next packet on a view several intervals old.
    hot: HashSet<BucketKey>,
    /// Touches not remembered because the ledger was full.
    pub dropped: u64,
}

impl Ledger {
    /// A prefix had packets since the last sync.
    pub fn touched(&mut self, key: BucketKey) {
        if self.pending.len() < MAX_PREFIXES || self.pending.contains(&key) {
            self.pending.insert(key);
        } else {
            self.dropped += 1;
        }
    }

    /// The prefixes to sync now: those touched, then those near their
    /// limit.
    #[must_use]
    pub fn pending(&self) -> Vec<BucketKey> {
        let mut v: Vec<BucketKey> = self.pending.iter().copied().collect();
        v.extend(self.hot.iter().filter(|k| !self.pending.contains(k)));
        v
    }

    /// After a sync: `key`'s window held `total` of `limit` in the fleet.
    pub fn heat(&mut self, key: BucketKey, total: u64, limit: u64) {
        if total.saturating_mul(2) >= limit {
            if self.hot.len() < MAX_PREFIXES {
                self.hot.insert(key);
            }
        } else {
            self.hot.remove(&key);
        }
    }

    /// Prefixes read back every sync because they are near their limit.
    #[must_use]
    pub fn hot_len(&self) -> usize {
        self.hot.len()
    }

    #[must_use]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The values to add to the store per (full) slice of `key`'s window
    /// ending in slice `cur`: local counts less what was pushed before,
    /// with the slice's first admission on its first push ([`stored`]).
    #[must_use]
    pub fn deltas(&self, key: &BucketKey, local: &WindowState, cur: u64, slices: u32) -> Vec<(u64, u64)> {
        let before = self.pushed.get(key).map(|p| slices_of(p, cur, slices)).unwrap_or_default();
        slices_of(local, cur, slices)
            .into_iter()
            .filter_map(|(s, n, first)| match before.iter().find(|(b, _, _)| *b == s) {
                Some((_, had, _)) => (n > *had).then(|| (s, n - had)),
                None => Some((s, stored(n, Some(first)))),
            })
            .collect()
    }

    /// `local` reached the store: it is what this node has pushed now.
    pub fn pushed(&mut self, key: BucketKey, local: WindowState) {
        self.pending.remove(&key);
        if self.pushed.len() < MAX_PREFIXES || self.pushed.contains_key(&key) {
            self.pushed.insert(key, local);
        }
    }

    /// A prefix no longer synced (its class is gone, or it left the map).
    pub fn forget(&mut self, key: &BucketKey) {
        self.pending.remove(key);
        self.pushed.remove(key);
        self.hot.remove(key);
    }

    /// Slices this node pushed for `key` that have left the window
    /// ending with `cur`: its own fields to delete from the store.
    #[must_use]
    pub fn expired(&self, key: &BucketKey, cur: u64, slices: u32) -> Vec<u64> {
        let Some(p) = self.pushed.get(key) else { return Vec::new() };
        // The leaving slice is kept: the other nodes still read its first
        // admission.
        let oldest = cur.saturating_sub(u64::from(slices));
        let mut v: Vec<u64> =
            p.slots.iter().filter(|s| **s != 0).map(|s| full_slice(*s, cur)).filter(|s| *s < oldest).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Forget what was pushed to windows that have ended (`now_slice` of
    /// each prefix's class given by `cur_of`).
    pub fn sweep(&mut self, cur_of: impl Fn(&BucketKey) -> Option<(u64, u32)>) {
        self.pushed.retain(|k, w| cur_of(k).is_some_and(|(cur, n)| !slices_of(w, cur, n).is_empty()));
    }

    /// Prefixes whose pushed counts are remembered.
    #[must_use]
    pub fn remembered(&self) -> usize {
        self.pushed.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use limiter_common::family;

    use super::*;

    fn key() -> BucketKey {
        BucketKey { family: family::IPV4, prefix_len: 24, class: 1, pad: 0, addr: [7, 0] }
    }

    /// Slices with their counts, each first admitted at position 7.
    pub(in crate::fleet) fn state(slots: &[(u64, u64)]) -> WindowState {
        let mut w = WindowState::default();
        for &(s, n) in slots {
            w.slots[window::slot_of(s, 12)] = window::slot(s, 7, n);
        }
        w
    }

    #[test]
    fn deltas_are_what_was_counted_since_the_last_push_per_slice() {
        let mut l = Ledger::default();
        let cur = 5_000_000_003;
        let local = state(&[(cur - 1, 10), (cur, 4)]);
        let first = |n| stored(n, Some(7));
        assert_eq!(
            l.deltas(&key(), &local, cur, 12),
            vec![(cur - 1, first(10)), (cur, first(4))],
            "first push: with its position"
        );
        l.pushed(key(), local);
        let later = state(&[(cur - 1, 10), (cur, 9)]);
        assert_eq!(l.deltas(&key(), &later, cur, 12), vec![(cur, 5)], "then counts only");
        // A window and a slice later the old slices are gone.
        let far = state(&[(cur + 13, 2)]);
        assert_eq!(l.deltas(&key(), &far, cur + 13, 12), vec![(cur + 13, first(2))]);
    }

    #[test]
    fn others_are_the_peers_counts_each_clamped_at_the_limit_inside_the_window() {
        let cur = 77;
        let v = |n: u64, first: u64| stored(n, Some(first));
        // Peer 0: 10 and 5 in the window. Peer 1 (hostile): a million now,
        // a million in slices before the window and far ahead.
        let reads = [(0, cur - 1), (0, cur), (1, cur - 13), (1, cur), (1, cur + 1), (1, cur + 5), (0, cur - 5)];
        let values = [v(10, 1), 5, v(1_000_000, 0), v(1_000_000, 0), v(1_000_000, 0), v(1_000_000, 0), v(3, 9)];
        let o = others(&reads, &values, cur, 12, 600);
        assert_eq!(slices_of(&o, cur, 12), vec![(cur - 5, 3, 9), (cur - 1, 10, 1), (cur, 605, 0)]);
        assert_eq!(window::total(&o, cur, 0, 12), 618, "peer 1 counts for its limit at most, peer 0 for what it sent");
        // Clamped oldest first: the limit is spent by the older slices.
        let o = others(&[(0, cur - 2), (0, cur)], &[500, 500], cur, 12, 600);
        assert_eq!(slices_of(&o, cur, 12), vec![(cur - 2, 500, 0), (cur, 100, 0)]);
        // The leaving slice: each peer's clamped on its own, the earliest
        // first admission of any.
        let o = others(&[(0, cur - 12), (1, cur - 12), (0, cur)], &[v(700, 30), v(5, 20), v(600, 0)], cur, 12, 600);
        assert_eq!(slices_of(&o, cur, 12), vec![(cur - 12, 605, 20), (cur, 600, 0)]);
        assert_eq!(window::total(&o, cur, 19, 12), 1205, "the leaving slice while its first admission is inside");
        assert_eq!(window::total(&o, cur, 20, 12), 600, "and not once it has left");
    }

    #[test]
    fn own_fields_that_left_the_window_are_named_for_deletion() {
        let mut l = Ledger::default();
        let cur = 100;
        l.pushed(key(), state(&[(cur - 1, 10), (cur, 4)]));
        assert!(l.expired(&key(), cur, 12).is_empty());
        assert!(l.expired(&key(), cur + 11, 12).is_empty(), "leaving: still read by the others");
        assert_eq!(l.expired(&key(), cur + 13, 12), vec![cur - 1, cur]);
        assert_eq!(l.expired(&key(), cur + 12, 12), vec![cur - 1]);
    }

    #[test]
    fn full_slice_numbers_survive_the_stamps_wrap() {
        let cur = (1u64 << 32) + 3;
        assert_eq!(full_slice(window::slot(cur - 5, 0, 1), cur), cur - 5);
        assert_eq!(full_slice(window::slot(cur, 0, 1), cur), cur);
    }

    #[test]
    fn prefixes_near_their_limit_are_read_back_every_sync_until_they_cool() {
        let mut l = Ledger::default();
        l.touched(key());
        l.heat(key(), 300, 600);
        l.pushed(key(), WindowState::default());
        assert_eq!(l.pending(), vec![key()], "hot: synced though not touched");
        l.heat(key(), 299, 600);
        assert!(l.pending().is_empty(), "cooled down");
    }

    #[test]
    fn memory_stays_bounded() {
        let mut l = Ledger::default();
        for i in 0..u32::try_from(MAX_PREFIXES).unwrap() + 10 {
            l.touched(BucketKey { addr: [i, 0], ..key() });
        }
        assert_eq!((l.pending_len(), l.dropped), (MAX_PREFIXES, 10));
    }
}
