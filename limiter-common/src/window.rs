//! Window quotas: "at most `limit` units per window", counted in
//! `slices` slices (the case study's sliding window counter, 600 per
//! 60 s in 12 slices of 5 s). A packet is admitted while the slices of
//! the current window (the current slice and the `slices - 1` before it)
//! hold fewer than `limit` units with this packet, local and, for a
//! fleet-scope class, the other nodes' as last synced.
//!
//! Each slot is one `u64`, `slice number (low 32 bits) << 32 | count`, so
//! a CPU moves a slot to a new slice and counts in it with one
//! compare-and-swap, and a slot left from an older slice reads as zero.
//! A window is therefore between `slices - 1` and `slices` slices long:
//! a sender at the very end of one slice and again at the start of the
//! slice a window later is counted in neither window of the other
//! (measured in `cargo xtask bench accuracy`).

/// Most slices of a window.
pub const MAX_SLICES: usize = 12;
/// Largest limit (a slot counts in 32 bits).
pub const MAX_LIMIT: u64 = u32::MAX as u64 / 2;
/// Shortest and longest slice.
pub const MIN_SLICE_NS: u64 = 1_000_000;
pub const MAX_SLICE_NS: u64 = 3_600 * 1_000_000_000;

/// Bits of [`crate::ClassLimits::scope`].
pub mod scope {
    /// Counted across the fleet (the daemon syncs it through the store).
    pub const FLEET: u32 = 1;
    /// While the store is unreachable, admit only `limit / nodes` locally
    /// (bounded overshoot; may refuse a compliant client). Without it the
    /// node decides on its last view plus local counts (open).
    pub const SPLIT_ON_FAILURE: u32 = 2;
}

/// Slice counts of one prefix (value of [`crate::maps::WINDOWS`] and
/// [`crate::maps::FLEET`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowState {
    pub slots: [u64; MAX_SLICES],
    /// In `WINDOWS`, for a fleet-scope prefix: the sync epoch
    /// ([`crate::maps::FLEET_STATE`]`[0]`) its last touch event was sent
    /// in; the program sends one on its first packet of each epoch.
    pub epoch: u64,
}

/// One event of [`crate::maps::TOUCHED`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Touch {
    pub key: crate::BucketKey,
    /// The sync epoch (low 32 bits) of the packet.
    pub epoch: u32,
}

const _: () = assert!(core::mem::size_of::<WindowState>() == 8 * MAX_SLICES + 8);
const _: () = assert!(core::mem::size_of::<Touch>() == 16);

/// The slice number of `now` (both in ns on the wall clock).
#[inline(always)]
#[must_use]
pub const fn slice_of(now: u64, slice_len: u64) -> u64 {
    // No panic path for the verifier: a zero length (never compiled) is 0.
    match now.checked_div(slice_len) {
        Some(s) => s,
        None => 0,
    }
}

/// The slot a slice is counted in.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "slices <= MAX_SLICES")]
pub const fn slot_of(slice: u64, slices: u32) -> usize {
    match slice.checked_rem(slices as u64) {
        Some(i) => i as usize,
        None => 0,
    }
}

/// A slot's count if it belongs to the window ending with slice `cur`
/// (of `slices` slices), else 0.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "slice numbers compare in their low 32 bits")]
pub const fn count_in(slot: u64, cur: u64, slices: u32) -> u64 {
    let stamp = (slot >> 32) as u32;
    if (cur as u32).wrapping_sub(stamp) < slices { slot & 0xffff_ffff } else { 0 }
}

/// Units counted in the window ending with slice `cur`.
#[inline(always)]
#[must_use]
pub fn total(w: &WindowState, cur: u64, slices: u32) -> u64 {
    let mut sum = 0;
    let mut i = 0;
    while i < MAX_SLICES {
        sum += count_in(w.slots[i], cur, slices);
        i += 1;
    }
    sum
}

/// A slot after `inc` more units in slice `cur`: added if the slot holds
/// that slice, else restarted at `inc` (the count saturates).
#[inline(always)]
#[must_use]
pub const fn bump(old: u64, cur: u64, inc: u64) -> u64 {
    let stamp = cur & 0xffff_ffff;
    if old >> 32 == stamp {
        let n = (old & 0xffff_ffff) + inc;
        (stamp << 32) | if n > 0xffff_ffff { 0xffff_ffff } else { n }
    } else {
        (stamp << 32) | if inc > 0xffff_ffff { 0xffff_ffff } else { inc }
    }
}

/// A slot holding `count` units of slice `slice`.
#[inline(always)]
#[must_use]
pub const fn slot(slice: u64, count: u64) -> u64 {
    ((slice & 0xffff_ffff) << 32) | if count > 0xffff_ffff { 0xffff_ffff } else { count }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// The case study's sliding window counter over admitted times, one
    /// unit each: slices of `slice`, `n` of them, `limit` per window.
    fn model(times: &[u64], slice: u64, n: u32, limit: u64) -> Vec<u64> {
        let mut w = WindowState::default();
        times
            .iter()
            .copied()
            .filter(|&t| {
                let cur = slice_of(t, slice);
                if total(&w, cur, n) + 1 > limit {
                    return false;
                }
                let i = slot_of(cur, n);
                w.slots[i] = bump(w.slots[i], cur, 1);
                true
            })
            .collect()
    }

    #[test]
    fn old_slices_read_as_zero_and_a_new_slice_restarts_its_slot() {
        let mut w = WindowState::default();
        w.slots[slot_of(100, 12)] = slot(100, 7);
        assert_eq!(total(&w, 100, 12), 7);
        assert_eq!(total(&w, 111, 12), 7, "still in the window 11 slices later");
        assert_eq!(total(&w, 112, 12), 0, "a window later it is gone");
        assert_eq!(bump(slot(100, 7), 100, 3), slot(100, 10));
        assert_eq!(bump(slot(100, 7), 112, 3), slot(112, 3));
        assert_eq!(bump(slot(5, 0xffff_fffe), 5, 9), slot(5, 0xffff_ffff), "saturates");
    }

    #[test]
    fn spaced_at_the_limit_is_never_refused_and_piled_at_the_boundary_is_held_to_the_limit() {
        // 600 per 60 s in 12 slices of 5 s (ms as time units).
        let spaced: Vec<u64> = (0..3).flat_map(|k| (0..600u64).map(move |i| k * 60_000 + i * 5_000 / 600)).collect();
        assert_eq!(model(&spaced, 5_000, 12, 600).len(), 1800);
        let mut piled: Vec<u64> = [60_000u64, 120_000]
            .iter()
            .flat_map(|b| {
                [(b - 5_000, 600u64), (*b, 600)].into_iter().flat_map(|(s, n)| (0..n).map(move |i| s + i * 5_000 / n))
            })
            .collect();
        piled.sort_unstable();
        assert_eq!(model(&piled, 5_000, 12, 600).len(), 1200);
    }
}
