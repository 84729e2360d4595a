//! Window quotas on the data plane (the arithmetic is
//! `limiter_common::window`): sum the prefix's slices of the exact window
//! ending now (the leaving slice while its first admission is still in
//! it), its own and, for a fleet-scope class, the other nodes' as last
//! synced; admit while the sum with this packet stays within the limit,
//! and count it in the current slice with one compare-and-swap.
//!
//! Two CPUs may both pass the check before either counts (the check and
//! the count are two steps): each racing CPU can admit one packet past
//! the limit, so the overshoot is bounded by the CPU count per instant
//! (measured in `cargo xtask bench accuracy`).

use core::{
    hint::black_box,
    ptr::{read_volatile, write_volatile},
};

use limiter_common::{
    BucketKey, ClassLimits, Reason, gcra,
    window::{self, FleetSlot, SLOTS, Touch, WindowState, scope},
};

use crate::{
    atomic::{self, Cas, cas},
    maps::{BPF_NOEXIST, FLEET, FLEET_STATE, TOUCHED, WINDOWS},
};

static EMPTY: WindowState = WindowState { slots: [0; SLOTS], epoch: 0, share: 0 };

/// The prefix's slice counts, created empty on its first packet.
#[inline(always)]
fn state(key: &BucketKey) -> Option<*mut WindowState> {
    if let Some(p) = WINDOWS.get_ptr_mut(key) {
        return Some(p);
    }
    // A racing CPU may have created it: either way it is there now. (The
    // empty value is read from .rodata, not built on the stack.)
    #[expect(clippy::needless_borrows_for_generic_args, reason = "by value it would be copied to the stack")]
    let _ = WINDOWS.insert(key, &EMPTY, BPF_NOEXIST);
    WINDOWS.get_ptr_mut(key)
}

/// Units of `w` in the window ending in slice `cur` whose start is at
/// position `at` of the leaving slice.
#[inline(always)]
fn counted(w: *const WindowState, cur: u64, at: u64, slices: u32) -> u64 {
    // Hidden from the compiler, which would otherwise see their bounds and
    // turn `count_in`'s arithmetic back into a branch a slot (which 6.1's
    // verifier could not walk within its limit).
    let (at, slices) = (black_box(at), black_box(u64::from(slices)));
    let mut seen = 0;
    for i in 0..SLOTS {
        // SAFETY: a live map value; an aligned 8-byte load is single-copy
        // atomic on the BPF ISA.
        seen += window::count_in(unsafe { read_volatile(&raw const (*w).slots[i]) }, cur, at, slices);
    }
    seen
}

/// Charge `units` to `key`'s window at `now` (1/16 ns on the program's
/// clock) under `l`.
#[inline(always)]
pub fn charge_window(key: &BucketKey, now: u64, units: u64, l: &ClassLimits) -> Reason {
    // Slices on the wall clock (ns): the same on every node of a fleet.
    let offset = FLEET_STATE.get(FleetSlot::WallOffset.index()).copied().unwrap_or(0);
    let (cur, here, edge) = window::locate((now >> gcra::TIME_SHIFT).wrapping_add(offset), l.slice_ns());
    let Some(w) = state(key) else { return Reason::BucketInsertFailed };
    let fleet = l.scope & scope::FLEET != 0;
    let mut limit = l.window_limit();
    let mut seen = counted(w, cur, edge, l.slices);
    let mut view: *mut WindowState = core::ptr::null_mut();
    if fleet {
        let split = FLEET_STATE.get(FleetSlot::Split.index()).copied().unwrap_or(0);
        if split != 0 && l.scope & scope::SPLIT_ON_FAILURE != 0 {
            // The store is down: this node's share only.
            limit /= split;
        } else if let Some(f) = FLEET.get_ptr_mut(key) {
            seen += counted(f, cur, edge, l.slices);
            // A prefix the sync found admitting fast, or refused here
            // within the window: what the others admitted since the sync,
            // as estimated (see `window::share`).
            // SAFETY: live map values, as above.
            let share = unsafe { read_volatile(&raw const (*f).share) };
            // SAFETY: as above.
            if share & window::SHARE_NOW != 0
                || window::refused_within(unsafe { read_volatile(&raw const (*w).share) }, cur, l.slices)
            {
                seen += window::others_since(share);
            }
            view = f;
        }
    }
    if seen + units > limit {
        if fleet {
            refused(w, cur);
        }
        return Reason::RateLimited;
    }
    let i = window::slot_of(cur, l.slices);
    if i >= SLOTS {
        return Reason::NoConfig;
    }
    // SAFETY: as above; `i` is in bounds.
    let p = unsafe { &raw mut (*w).slots[i] };
    if cas(p, |old| Some(window::bump(old, cur, here, units))) != Cas::Done {
        return Reason::Contended;
    }
    if !view.is_null() {
        // This node's admissions since the sync. (A sync replacing the
        // value meanwhile loses this count from the estimate, not from
        // the window.)
        // SAFETY: a live map value (non-null: `FLEET`'s above).
        atomic::add(unsafe { &raw mut (*view).share }, units);
    }
    if fleet {
        touch(key, w);
    }
    Reason::Admitted
}

/// Mark `w` refused in slice `cur` (written only when it changes: a flood
/// refused on every CPU does not bounce the line on each packet).
#[inline(always)]
fn refused(w: *mut WindowState, cur: u64) {
    let mark = window::refusal(cur);
    // SAFETY: a live map value, as above.
    unsafe {
        let p = &raw mut (*w).share;
        if read_volatile(p) != mark {
            write_volatile(p, mark);
        }
    }
}

/// The first packet of a fleet-scope prefix in a sync epoch tells the
/// daemon (one CPU wins the swap, so one event per prefix and epoch).
#[inline(always)]
fn touch(key: &BucketKey, w: *mut WindowState) {
    let epoch = FLEET_STATE.get(FleetSlot::Epoch.index()).copied().unwrap_or(0);
    // SAFETY: a live map value, as above.
    let p = unsafe { &raw mut (*w).epoch };
    if cas(p, |seen| (seen != epoch).then_some(epoch)) == Cas::Done {
        #[expect(clippy::cast_possible_truncation, reason = "epochs travel in their low 32 bits")]
        let _ = TOUCHED.output::<Touch>(&Touch { key: *key, epoch: epoch as u32 }, 0);
    }
}
