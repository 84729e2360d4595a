//! Window quotas: "at most `limit` units per window", counted in
//! `slices` slices (the case study's sliding window counter, 600 per
//! 60 s in 12 slices of 5 s), made exact at the window's trailing edge.
//!
//! A packet at time `t` is admitted while the exact window `(t - W, t]`
//! holds fewer than `limit` units with it, local and, for a fleet-scope
//! class, the other nodes' as last synced. The slices wholly inside that
//! window (the current one and the `slices - 1` before it) count in full.
//! The slice the window's start falls in, the one leaving, is kept too (a
//! window has `slices + 1` slots), with the position of its first
//! admission in 1/4096 of the slice: while the window's start is before
//! that first admission, every unit of the slice is still in the window
//! and counts; from then on none does. So the leaving slice is released
//! when its first admission leaves, not when the slice's start does, as a
//! counter of whole slices would (that one admits up to a slice's worth
//! more than the limit in some exact window: 1.04-1.36x of the limit for
//! floods starting at random phases, 2x at 100x the rate).
//!
//! The estimate never counts a unit that has left the window (a compliant
//! client is judged by the exact count or less: never refused), and
//! misses at most the units admitted after the leaving slice's first,
//! still inside the window: under a constant flood these are admitted at
//! the pace at which the first ones leave, so the busiest exact window
//! stays within a few units of the limit (`cargo xtask bench accuracy`).
//! The worst case, a slice whose admissions are spread over it followed
//! by a burst the instant its first one leaves, is bounded by the limit
//! plus that slice's count: at most 2x, as for a counter of whole slices.
//!
//! Across a fleet each node adds the other nodes' counts as last synced,
//! and between two syncs every node sees the budget the moving window
//! frees: each would spend all of it, so a prefix flooding every node
//! could pass its limit by one sync interval's arrivals. A sync therefore
//! also writes a share ([`share`]): how many admissions elsewhere to count
//! per admission here since the sync (the others' recent admissions per
//! one of this node's, at most one per other node). The program counts
//! its admissions since the sync in the `FLEET` value and adds the
//! estimate once it has refused the prefix within the window (the mark in
//! `WINDOWS`), or at once when the sync found the fleet admitting the
//! prefix fast; otherwise (a compliant client) the counts alone decide.
//!
//! Each slot is one `u64`: the slice number (low 20 bits) << 44 | the
//! position of its first admission (12 bits) << 32 | count, so a CPU
//! moves a slot to a new slice and counts in it with one compare-and-swap
//! and a slot left from an older slice reads as zero (20 bits of slice
//! number wrap after 2^20 slices: 17 minutes of 1 ms slices, 12 days of
//! 1 s slices; a prefix silent for exactly that long could see an old
//! count for one window).

/// Most slices of a window.
pub const MAX_SLICES: usize = 12;
/// Slots of a window: its slices and the one leaving.
pub const SLOTS: usize = MAX_SLICES + 1;
/// Largest limit (a slot counts in 32 bits).
pub const MAX_LIMIT: u64 = u32::MAX as u64 / 2;
/// Shortest and longest slice.
pub const MIN_SLICE_NS: u64 = 1_000_000;
pub const MAX_SLICE_NS: u64 = 3_600 * 1_000_000_000;
/// Positions in a slice: 1/4096 of it.
pub const POSITION_BITS: u32 = 12;
const STAMP_BITS: u32 = 20;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
const COUNT_MASK: u64 = 0xffff_ffff;

/// Bits of [`crate::ClassLimits::scope`].
pub mod scope {
    /// Counted across the fleet (the daemon syncs it through the store).
    pub const FLEET: u32 = 1;
    /// While the store is unreachable, admit only `limit / nodes` locally
    /// (bounded overshoot; may refuse a compliant client). Without it the
    /// node decides on its last view plus local counts (open).
    pub const SPLIT_ON_FAILURE: u32 = 2;
}

/// The entries of [`crate::maps::FLEET_STATE`], each a `u64` written by
/// the daemon and read by the program. Separate entries, not one struct:
/// the fleet sync and the daemon write different ones from different
/// threads, and a whole-entry update of a struct would need a
/// read-modify-write between them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetSlot {
    /// The sync epoch, bumped every sync (see [`WindowState::epoch`]).
    Epoch = 0,
    /// 0 while the store is reachable, else the fleet's node count: a
    /// class with [`scope::SPLIT_ON_FAILURE`] admits `limit / nodes`.
    Split = 1,
    /// The wall clock's offset from the program's clock in ns, so that
    /// window slices start at the same moment on every node (a replay
    /// sets the capture's own).
    WallOffset = 2,
}

impl FleetSlot {
    /// Entries of the map.
    pub const COUNT: u32 = 3;

    /// The entry's index.
    #[inline(always)]
    #[must_use]
    pub const fn index(self) -> u32 {
        self as u32
    }
}

/// Slice counts of one prefix (value of [`crate::maps::WINDOWS`] and
/// [`crate::maps::FLEET`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowState {
    pub slots: [u64; SLOTS],
    /// In `WINDOWS`, for a fleet-scope prefix: the sync epoch
    /// ([`crate::maps::FLEET_STATE`]`[0]`) its last touch event was sent
    /// in; the program sends one on its first packet of each epoch.
    pub epoch: u64,
    /// A fleet-scope prefix's share of what is freed between two syncs.
    /// In `WINDOWS`: this node's last refusal of the prefix ([`refusal`]),
    /// 0 if none. In `FLEET`: the last sync's estimate of the other nodes'
    /// admissions per admission here, and this node's admissions since
    /// that sync ([`share`]).
    pub share: u64,
}

/// One event of [`crate::maps::TOUCHED`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Touch {
    pub key: crate::BucketKey,
    /// The sync epoch (low 32 bits) of the packet.
    pub epoch: u32,
}

const _: () = assert!(core::mem::size_of::<WindowState>() == 8 * SLOTS + 16);
const _: () = assert!(core::mem::size_of::<Touch>() == 16);

/// The production program's clock (the coarse one) lags true time by up
/// to two jiffies (8 ms at HZ=250): a client exactly at its limit could
/// have two admissions a window apart stamped up to 8 ms less than a
/// window apart. The window's start is therefore taken this much later
/// than exact when judging the leaving slice (the lag and 2 ms of the
/// sender's own jitter), so that the clock never refuses a compliant
/// client; a flood gains at most what it gets admitted in this span after
/// the leaving slice's first admission (`rate x 10 ms`).
pub const EDGE_TOLERANCE_NS: u64 = 10_000_000;
/// A position past every admission's: the leaving slice counts for none.
pub const PAST_THE_SLICE: u64 = 1 << POSITION_BITS;

/// Where `now` falls: its slice number, its position in that slice (1/4096
/// of it, rounded down: where an admission now is recorded), and the
/// position the window's start is taken at in the leaving slice (later
/// by [`EDGE_TOLERANCE_NS`], [`PAST_THE_SLICE`] when that passes the
/// slice's end). All from ns on the wall clock.
#[inline(always)]
#[must_use]
pub const fn locate(now: u64, slice_len: u64) -> (u64, u64, u64) {
    // No panic path for the verifier: a zero length (never compiled) is 0.
    // One division for the slice; the remainder by a multiplication (the
    // program runs this for every packet of a window class).
    match now.checked_div(slice_len) {
        Some(s) => {
            let r = now - s * slice_len;
            let edge = r + EDGE_TOLERANCE_NS;
            let edge = if edge >= slice_len { PAST_THE_SLICE } else { position(edge, slice_len) };
            (s, position(r, slice_len), edge)
        }
        None => (0, 0, PAST_THE_SLICE),
    }
}

/// The slice number of `now` (both in ns on the wall clock).
#[inline(always)]
#[must_use]
pub const fn slice_of(now: u64, slice_len: u64) -> u64 {
    match now.checked_div(slice_len) {
        Some(s) => s,
        None => 0,
    }
}

/// `into` ns into a slice of `len` ns, in 1/4096 of the slice. Slices are
/// at most an hour (< 2^42 ns), so the product fits.
#[inline(always)]
#[must_use]
const fn position(into: u64, len: u64) -> u64 {
    match (into << POSITION_BITS).checked_div(len) {
        Some(p) if p <= POSITION_MASK => p,
        Some(_) => POSITION_MASK,
        None => 0,
    }
}

/// The slot a slice is counted in.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "slices <= MAX_SLICES")]
pub const fn slot_of(slice: u64, slices: u32) -> usize {
    match slice.checked_rem(slices as u64 + 1) {
        Some(i) => i as usize,
        None => 0,
    }
}

/// How many slices before `cur` a slot's slice is (its stamp read
/// against `cur`'s low 20 bits).
#[inline(always)]
#[must_use]
pub const fn age(slot: u64, cur: u64) -> u64 {
    (cur.wrapping_sub(slot >> (32 + POSITION_BITS))) & STAMP_MASK
}

/// A slot's count.
#[inline(always)]
#[must_use]
pub const fn count(slot: u64) -> u64 {
    slot & COUNT_MASK
}

/// The position of a slot's first admission.
#[inline(always)]
#[must_use]
pub const fn first(slot: u64) -> u64 {
    (slot >> 32) & POSITION_MASK
}

/// A slot's units in the window that ends in slice `cur` (of `slices`
/// slices) and starts at position `at` of the leaving slice (see
/// [`locate`]): all of a slice wholly inside; all of the leaving slice
/// while its first admission is after the window's start, else none.
///
/// Written without a branch: the program sums every slot this way, and a
/// three-way branch a slot made the verifier of 6.1 walk more than its
/// million instructions in `limiter_charge_window` (its states never
/// pruned); as arithmetic the sum is one straight run on every kernel.
/// (The compiler turns it back into comparisons when it can bound `at`
/// and `slices`: the program's caller hides them from it.)
#[inline(always)]
#[must_use]
pub const fn count_in(slot: u64, cur: u64, at: u64, slices: u64) -> u64 {
    let age = age(slot, cur);
    let inside = below(age, slices);
    let leaving = below(age, slices + 1) ^ inside;
    let after_start = below(at, first(slot));
    count(slot) & (inside | (leaving & after_start)).wrapping_neg()
}

/// 1 if `a < b`, else 0, for `a` and `b` below 2^63 (a slot's age, a
/// position and a slice count are below 2^33): the sign bit of `a - b`,
/// computed without a branch.
#[inline(always)]
const fn below(a: u64, b: u64) -> u64 {
    a.wrapping_sub(b) >> 63
}

/// Units counted in the window that ends in slice `cur` and starts at
/// position `at` of the leaving slice.
#[inline(always)]
#[must_use]
pub fn total(w: &WindowState, cur: u64, at: u64, slices: u32) -> u64 {
    let mut sum = 0;
    let mut i = 0;
    while i < SLOTS {
        sum += count_in(w.slots[i], cur, at, u64::from(slices));
        i += 1;
    }
    sum
}

/// A slot after `inc` more units at position `at` of slice `cur`: added
/// if the slot holds that slice, else restarted at `inc` with its first
/// admission at `at` (the count saturates).
#[inline(always)]
#[must_use]
pub const fn bump(old: u64, cur: u64, at: u64, inc: u64) -> u64 {
    if age(old, cur) == 0 && old != 0 {
        let n = count(old) + inc;
        (old & !COUNT_MASK) | if n > COUNT_MASK { COUNT_MASK } else { n }
    } else {
        slot(cur, at, inc)
    }
}

/// Fixed point of a share's factor: 1/256 of an admission.
pub const SHARE_SHIFT: u32 = 8;
/// Largest factor of a share: 255 other nodes each admitting as much.
pub const MAX_SHARE_FACTOR: u64 = 255 << SHARE_SHIFT;
/// Bit of a share: apply it whether or not this node has refused the
/// prefix (the sync found it admitting fast).
pub const SHARE_NOW: u64 = 1 << 63;

/// A `FLEET` share: `factor` (in 1/256) other-node admissions estimated
/// per admission here, `since` admissions here since the sync (the
/// program adds to the low 32 bits), and whether it applies `now`.
#[inline(always)]
#[must_use]
pub const fn share(factor: u64, since: u64, now: bool) -> u64 {
    let factor = if factor > MAX_SHARE_FACTOR { MAX_SHARE_FACTOR } else { factor };
    (if now { SHARE_NOW } else { 0 }) | (factor << 32) | (since & COUNT_MASK)
}

/// The other nodes' admissions since the last sync, as `share` estimates
/// them: its factor times this node's own since then.
#[inline(always)]
#[must_use]
pub const fn others_since(share: u64) -> u64 {
    (((share & !SHARE_NOW) >> 32) * (share & COUNT_MASK)) >> SHARE_SHIFT
}

/// The `WINDOWS` mark of a refusal in slice `cur`.
#[inline(always)]
#[must_use]
pub const fn refusal(cur: u64) -> u64 {
    cur.wrapping_add(1)
}

/// Whether `mark` ([`refusal`]) is of a refusal in the window ending in
/// slice `cur`.
#[inline(always)]
#[must_use]
pub const fn refused_within(mark: u64, cur: u64, slices: u32) -> bool {
    mark != 0 && refusal(cur).wrapping_sub(mark) <= slices as u64
}

/// A slot holding `count` units of slice `slice`, the first at `first`.
#[inline(always)]
#[must_use]
pub const fn slot(slice: u64, first: u64, count: u64) -> u64 {
    ((slice & STAMP_MASK) << (32 + POSITION_BITS))
        | ((first & POSITION_MASK) << 32)
        | if count > COUNT_MASK { COUNT_MASK } else { count }
}

#[cfg(test)]
mod tests;
