//! The window arithmetic on its own: a slice counts in full until its
//! first admission leaves, the seed's patterns give its row, and floods
//! starting anywhere stay at the limit in every exact window.

extern crate std;
use std::vec::Vec;

use super::*;

/// The window counter over arrival times, one unit each: slices of
/// `slice`, `n` of them, `limit` per window; the admitted times.
fn model(times: &[u64], slice: u64, n: u32, limit: u64) -> Vec<u64> {
    let mut w = WindowState::default();
    times
        .iter()
        .copied()
        .filter(|&t| {
            let (cur, here, edge) = locate(t, slice);
            if total(&w, cur, edge, n) + 1 > limit {
                return false;
            }
            let i = slot_of(cur, n);
            w.slots[i] = bump(w.slots[i], cur, here, 1);
            true
        })
        .collect()
}

/// Most times in any half-open `[t, t + w)`.
fn busiest(adm: &[u64], w: u64) -> usize {
    let (mut best, mut j) = (0, 0);
    for i in 0..adm.len() {
        while adm[i] - adm[j] >= w {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best
}

#[test]
fn a_slice_counts_in_full_inside_and_until_its_first_admission_leaves() {
    let mut w = WindowState::default();
    // Slice 100, first admission at 1/4 of it.
    w.slots[slot_of(100, 12)] = slot(100, 1024, 7);
    assert_eq!(total(&w, 100, 0, 12), 7);
    assert_eq!(total(&w, 111, 4095, 12), 7, "still inside 11 slices later");
    assert_eq!(total(&w, 112, 1023, 12), 7, "leaving, its first admission still inside");
    assert_eq!(total(&w, 112, 1024, 12), 0, "its first admission has left");
    assert_eq!(total(&w, 113, 0, 12), 0, "a window and a slice later it is gone");
    assert_eq!(bump(slot(100, 1024, 7), 100, 3000, 3), slot(100, 1024, 10), "the first stays");
    assert_eq!(bump(slot(100, 1024, 7), 113, 5, 3), slot(113, 5, 3));
    assert_eq!(bump(0, 0, 9, 1), slot(0, 9, 1), "an empty slot restarts even in slice 0");
    assert_eq!(bump(slot(5, 0, 0xffff_fffe), 5, 1, 9), slot(5, 0, 0xffff_ffff), "saturates");
    // 10 ms of tolerance: 1/4096 of a 4.096 s slice is 1 ms.
    assert_eq!(locate(4_096_000_000 * 7 + 2_000_000, 4_096_000_000), (7, 2, 12));
    assert_eq!(locate(4_096_000_000 * 8 - 1_000_000, 4_096_000_000), (7, 4095, PAST_THE_SLICE));
}

#[test]
fn the_seed_patterns_give_the_seed_row_and_compliant_clients_are_never_refused() {
    // 600 per 60 s in 12 slices of 5 s (ms, run in ns).
    let model = |t: &[u64], slice: u64, n, limit| {
        let ns: Vec<u64> = t.iter().map(|t| t * 1_000_000).collect();
        model(&ns, slice * 1_000_000, n, limit).into_iter().map(|t| t / 1_000_000).collect::<Vec<u64>>()
    };
    let spaced: Vec<u64> = (0..3).flat_map(|k| (0..600u64).map(move |i| k * 60_000 + i * 5_000 / 50)).collect();
    assert_eq!(model(&spaced, 5_000, 12, 600).len(), 1800);
    let mut piled: Vec<u64> = [60_000u64, 120_000]
        .iter()
        .flat_map(|b| {
            [(b - 5_000, 600u64), (*b, 600)].into_iter().flat_map(|(s, n)| (0..n).map(move |i| s + i * 5_000 / n))
        })
        .collect();
    piled.sort_unstable();
    let adm = model(&piled, 5_000, 12, 600);
    assert_eq!(adm.len(), 1200);
    assert!(busiest(&adm, 60_000) <= 600);
    // Spaced at the limit, starting anywhere: never refused.
    for phase in (0..5_000).step_by(137) {
        let t: Vec<u64> = (0..1800u64).map(|i| 1_000_000 + phase + i * 100).collect();
        assert_eq!(model(&t, 5_000, 12, 600).len(), 1800, "phase {phase}");
    }
}

#[test]
fn floods_starting_anywhere_stay_at_the_limit_in_every_exact_window() {
    // 1200 per 12 s in 1 s slices (us, run in ns), 9x and 100x.
    let model = |t: &[u64], slice: u64, n, limit| {
        let ns: Vec<u64> = t.iter().map(|t| t * 1_000).collect();
        model(&ns, slice * 1_000, n, limit).into_iter().map(|t| t / 1_000).collect::<Vec<u64>>()
    };
    for rate_x in [9u64, 100] {
        let gap = 12_000_000 / (1200 * rate_x);
        for phase in (0..1_000_000).step_by(70_001) {
            let t: Vec<u64> = (0..40_000_000 / gap).map(|i| 5_000_000_000 + phase + i * gap).collect();
            let adm = model(&t, 1_000_000, 12, 1200);
            let b = busiest(&adm, 12_000_000) as u64;
            // The bound: the limit, what the flood gets in the edge's
            // tolerance and one position (1/4096 of the slice), and one.
            let rate = 1200 * rate_x / 12;
            let span_ns = EDGE_TOLERANCE_NS + 1_000_000_000 / 4096;
            assert!(b <= 1200 + rate * span_ns / 1_000_000_000 + 1, "{rate_x}x at phase {phase}: {b}");
        }
    }
}

proptest::proptest! {
    /// The branchless `count_in` is the definition, written plainly: all
    /// of a slice wholly inside the window, all of the leaving slice while
    /// its first admission is after the window's start, else none.
    #[test]
    fn count_in_is_its_definition(
        count in 0u64..=COUNT_MASK,
        stamp in 0u64..=STAMP_MASK,
        first_at in 0u64..=POSITION_MASK,
        cur in proptest::prelude::any::<u64>(),
        at in 0u64..=POSITION_MASK,
        s in 1u64..=MAX_SLICES as u64,
        near in proptest::prelude::any::<bool>(),
    ) {
        // Half the cases put the slot's slice within a few of the window.
        let stamp = if near { (cur.wrapping_sub(stamp % (s + 3))) & STAMP_MASK } else { stamp };
        let slot = (stamp << (32 + POSITION_BITS)) | (first_at << 32) | count;
        let age = age(slot, cur);
        let plain = if age < s || (age == s && first(slot) > at) { count } else { 0 };
        proptest::prop_assert_eq!(count_in(slot, cur, at, s), plain);
    }
}
