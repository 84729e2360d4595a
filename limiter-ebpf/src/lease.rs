//! This CPU's `CPU_SLOTS` entry for a bucket: a lease of the bucket's
//! credit, or a cached refusal, and the charge of an existing bucket that
//! takes them (see `limiter_common::lease` for the bound
//! and why no compliant source is refused for another CPU's credit).

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_cxchg},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::helpers::bpf_map_lookup_percpu_elem;
use limiter_common::{
    BucketKey, BucketState, ClassLimits, Reason, cost,
    groups::MAX_GROUPS,
    lease::{self, CREDIT_MASK, CpuSlot, MAX_CPUS, slot_flags},
    mode,
};

use crate::{
    atomic::{Cas, cas, charge_existing, refund},
    maps::{BUCKETS, CPU_SLOTS, GROUP_HITS},
};

/// An existing bucket's charge, through this CPU's slot when it is in
/// use: credit this CPU's slot still holds for the bucket is given back
/// first; a lease is taken when the bucket holds plenty; a refusal first
/// takes back the other CPUs' credit for the bucket and charges again,
/// then is remembered (packet cost only: a smaller packet may fit where
/// this one did not).
#[inline(always)]
#[expect(clippy::too_many_arguments, reason = "one packet's charge, all of it scalars but the slot and limits")]
pub fn charge_leasing(
    p: *mut BucketState,
    slot: &Slot,
    key: &BucketKey,
    version: u32,
    now: u64,
    cpus: u32,
    limits: &ClassLimits,
    inc: u64,
) -> Reason {
    let bytes = limits.cost == cost::BYTES;
    let lease = if slot.usable() { lease::lease(limits.unit, limits.tau, bytes, cpus) } else { 0 };
    // A lease only for a prefix this CPU saw last time it used the slot:
    // a prefix that sends one packet now and then never takes one (it
    // would only be given back, at the cost of another lookup).
    let seen = slot.holds(key);
    slot.give_back_own(key);
    let (step, leased) = charge_existing_leasing(p, now, inc, limits.tau, if seen { lease } else { 0 }, cpus);
    let flags = slot_flags::LEASE | if bytes { slot_flags::BYTES } else { 0 };
    let step = match step {
        Cas::Done if leased => {
            slot.write(key, version, now.saturating_add(lease), limits.unit, flags, lease);
            Cas::Done
        }
        // Remember the prefix, without taking the slot from another
        // prefix's lease.
        Cas::Done if lease != 0 && !seen && slot.is_idle() => {
            slot.write(key, version, 0, limits.unit, flags, 0);
            Cas::Done
        }
        Cas::Refused(_) if slot.steal(key, cpus) => charge_existing(p, now, inc, limits.tau),
        s => s,
    };
    if let Cas::Refused(seen) = step
        && !bytes
    {
        let until = seen.saturating_add(inc).saturating_sub(limits.tau);
        let shadow = if limits.mode == mode::SHADOW { slot_flags::SHADOW } else { 0 };
        slot.write(key, version, until, 0, shadow, 0);
    }
    step.reason()
}

/// [`charge_existing`] that may also take a lease of `lease` (see
/// `limiter_common::lease::admit`); whether it did.
#[inline(always)]
fn charge_existing_leasing(p: *mut BucketState, now: u64, inc: u64, tau: u64, lease: u64, cpus: u32) -> (Cas, bool) {
    if lease == 0 {
        return (charge_existing(p, now, inc, tau), false);
    }
    let mut leased = false;
    // SAFETY: p points to a live map value.
    let step = cas(unsafe { &raw mut (*p).tat }, |cur| {
        let (next, l) = lease::admit(cur, now, inc, tau, lease, cpus)?;
        leased = l;
        Some(next)
    });
    (step, leased)
}

/// Swap `*p` from `old` to `new`; whether it was still `old`.
#[inline(always)]
fn swap(p: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: callers pass a word of a live map value; BPF_CMPXCHG on a
    // map value is verifier-approved.
    unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, old, new).1 }
}

/// What this CPU's entry knows of a packet's bucket.
pub enum Hit {
    /// The packet's reason, from a cached refusal or denial, or a lease.
    Reason(Reason),
    /// Denied by the deny set: its value there (the origin to count the
    /// drop under).
    Listed(u32),
    /// The bucket holds finer denied networks: ask the address first.
    Finer,
    /// Nothing: charge the bucket.
    Miss,
}

/// This CPU's entry for a bucket key, if slots are in use.
pub struct Slot {
    entry: Option<*mut CpuSlot>,
    index: u32,
}

impl Slot {
    /// The entry `key` maps to; none when `usable` is false (refusals are
    /// cached, and leases taken, only where a bucket's tat cannot go down
    /// otherwise: the aggregate tier off).
    #[inline(always)]
    pub fn probe(key: &BucketKey, usable: bool) -> Self {
        let index = CpuSlot::index(key);
        Self { entry: if usable { CPU_SLOTS.get_ptr_mut(index) } else { None }, index }
    }

    /// Whether leases may be taken and cached refusals kept.
    #[inline(always)]
    pub fn usable(&self) -> bool {
        self.entry.is_some()
    }

    /// The fast path: a refusal or denial cached for `key` under
    /// `version` that still holds, a packet of `len` bytes admitted from
    /// this CPU's lease of `key`'s bucket, or the bucket known to hold
    /// finer denied networks.
    #[inline(always)]
    pub fn hit(&self, key: &BucketKey, version: u32, now: u64, len: u64) -> Hit {
        let Some(e) = self.entry else { return Hit::Miss };
        // SAFETY: this CPU's entry; other CPUs only swap its word.
        let s = unsafe { &*e };
        if !s.is_for(key, version, now) {
            return Hit::Miss;
        }
        if s.flags & slot_flags::FINER != 0 {
            return Hit::Finer;
        }
        if let Some(r) = s.refusal() {
            if s.flags & slot_flags::DENIED != 0 && s.unit != u64::MAX {
                #[expect(clippy::cast_possible_truncation, reason = "a deny set value")]
                return Hit::Listed(s.unit as u32);
            }
            return Hit::Reason(r);
        }
        // SAFETY: as above.
        let word = unsafe { &raw mut (*e).word };
        // SAFETY: an aligned 8-byte load is single-copy atomic.
        let w = unsafe { read_volatile(word) };
        let Some(next) = lease::spend(w, s.inc(len)) else { return Hit::Miss };
        if s.pad == 0 {
            return if swap(word, w, next) { Hit::Reason(Reason::Admitted) } else { Hit::Miss };
        }
        // A grouped bucket's lease admits only while this CPU's lease of
        // the group's budget holds the packet too (a pointer kept in this
        // branch alone: 6.1's verifier loses one merged with a null).
        let Some(h) = GROUP_HITS.get_ptr_mut((s.pad - 1) & (MAX_GROUPS - 1)) else { return Hit::Miss };
        // SAFETY: per-CPU slot, only this CPU's softirq touches it.
        let h = unsafe { &mut *h };
        if !h.lease_holds(version, now) || !swap(word, w, next) {
            return Hit::Miss;
        }
        h.spend();
        h.passed += 1;
        Hit::Reason(Reason::Admitted)
    }

    /// The origin of the deny set's denial of the address whose entry key
    /// is `key` (and last 64 bits `lo`), if this CPU's entry remembers
    /// one under `version`.
    #[inline(always)]
    pub fn address_denied(&self, key: &BucketKey, lo: u64, version: u32) -> Option<u32> {
        // SAFETY: this CPU's entry.
        let s = unsafe { &*self.entry? };
        (s.flags == slot_flags::ADDRESS && s.unit == lo && s.version == version && s.key == *key).then_some(s.pad)
    }

    /// Remember in this CPU's entry that the deny set denies the address
    /// whose entry key is `key` (and last 64 bits `lo`), for `origin`.
    #[inline(always)]
    pub fn remember_address(&self, key: &BucketKey, lo: u64, version: u32, origin: u32) {
        self.write(key, version, u64::MAX, lo, slot_flags::ADDRESS, 0);
        if let Some(e) = self.entry {
            // SAFETY: this CPU's entry, just written.
            unsafe { (*e).pad = origin };
        }
    }

    /// Remember in this CPU's entry that `key`'s bucket (under
    /// `version`) is denied (`origin`: the deny set's, or `u64::MAX`), or
    /// holds finer denied networks (`finer`).
    #[inline(always)]
    pub fn remember(&self, key: &BucketKey, version: u32, finer: bool, origin: u64) {
        let flags = if finer { slot_flags::FINER } else { slot_flags::DENIED };
        self.write(key, version, u64::MAX, origin, flags, 0);
    }

    /// Mark this CPU's entry, if it is a lease of `key`'s bucket, as of
    /// group `g` (its index in `pad`, plus one): [`Self::hit`] then
    /// charges the group's lease too. Only this CPU reads `pad` of a
    /// lease, and [`Self::write`] clears it.
    #[inline(always)]
    pub fn mark_group(&self, key: &BucketKey, g: u32) {
        if let Some(e) = self.entry {
            // SAFETY: this CPU's entry; only this CPU writes its fields
            // but the word.
            let s = unsafe { &mut *e };
            if s.flags & slot_flags::LEASE != 0 && s.key == *key {
                s.pad = g + 1;
            }
        }
    }

    /// Whether this CPU's entry is `key`'s (of any version, in any state).
    #[inline(always)]
    pub fn holds(&self, key: &BucketKey) -> bool {
        // SAFETY: this CPU's entry; only this CPU writes its key.
        self.entry.is_some_and(|e| unsafe { (*e).key == *key })
    }

    /// Whether this CPU's entry holds no credit (so writing it gives
    /// nothing back and takes no lease away).
    #[inline(always)]
    pub fn is_idle(&self) -> bool {
        // SAFETY: a live map value; an aligned 8-byte load.
        self.entry.is_some_and(|e| unsafe { read_volatile(&raw const (*e).word) } & CREDIT_MASK == 0)
    }

    /// Give back to `key`'s bucket the credit this CPU's entry still
    /// holds for it (a lease spent down, expired, or of an older policy),
    /// before the bucket is charged.
    #[inline(always)]
    pub fn give_back_own(&self, key: &BucketKey) {
        if let Some(e) = self.entry
            // SAFETY: this CPU's entry; only this CPU writes its key.
            && unsafe { (*e).key == *key }
        {
            let back = take_credit(e);
            if back != 0 {
                let (head, tail) = BucketKey::words(key);
                limiter_give_back(head, tail, back);
            }
        }
    }

    /// Make this CPU's entry a lease of `credit` of `key`'s bucket, or
    /// (`flags` without `slot_flags::LEASE`) a refusal, until `until`.
    /// Credit it still holds for another bucket is given back to that
    /// bucket first (if it is still tracked). Its fields change while its
    /// credit is zero, and the new credit comes with a new sequence
    /// number: see `limiter_common::lease`.
    #[inline(always)]
    pub fn write(&self, key: &BucketKey, version: u32, until: u64, unit: u64, flags: u32, credit: u64) {
        let Some(e) = self.entry else { return };
        let left = take_credit(e);
        // SAFETY: this CPU's entry.
        let s = unsafe { &mut *e };
        if left != 0 {
            let (head, tail) = BucketKey::words(&s.key);
            limiter_give_back(head, tail, left);
        }
        s.key = *key;
        s.version = version;
        s.until = until;
        s.unit = unit;
        s.flags = flags;
        s.pad = 0;
        // SAFETY: as above; the credit is zero, so no other CPU swaps the
        // word until this store.
        unsafe { write_volatile(&raw mut s.word, lease::restock(read_volatile(&raw const s.word), credit)) };
    }

    /// Take back the credit the other CPUs' entries hold for `key`'s
    /// bucket and give it back to the bucket (before a refusal); whether
    /// the bucket should be charged again.
    #[inline(always)]
    pub fn steal(&self, key: &BucketKey, cpus: u32) -> bool {
        if self.entry.is_none() || cpus < 2 {
            return false;
        }
        let (head, tail) = BucketKey::words(key);
        limiter_steal(head, tail, self.index, cpus);
        true
    }
}

/// Give `credit` back to the bucket of the key in `head, tail` (see
/// `BucketKey::words`), if it is still tracked. A global function, as
/// [`limiter_steal`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_give_back(head: u64, tail: u64, credit: u64) -> u64 {
    if let Some(p) = BUCKETS.get_ptr_mut(BucketKey::from_words(head, tail)) {
        refund(p, credit);
    }
    0
}

/// Zero the credit of entry `e` (which other CPUs may zero too) and
/// return what it held.
#[inline(always)]
fn take_credit(e: *mut CpuSlot) -> u64 {
    // SAFETY: a live map value.
    let word = unsafe { &raw mut (*e).word };
    for _ in 0..2 {
        // SAFETY: as above.
        let w = unsafe { read_volatile(word) };
        if w & CREDIT_MASK == 0 {
            return 0;
        }
        if swap(word, w, lease::restock(w, 0)) {
            return w & CREDIT_MASK;
        }
        // Another CPU took it in between: the next read sees zero.
    }
    0
}

/// Zero the credit every other CPU's entry `index` holds for the key in
/// `head, tail` (see `BucketKey::words`) and give it back to its bucket.
/// A global function: the verifier checks it once, on its own, instead of
/// once per state of every path that reaches it. Its loop keeps no state
/// from one CPU to the next (this CPU's own entry holds no credit for the
/// key by now), so the verifier's states merge at every turn.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_steal(head: u64, tail: u64, index: u32, cpus: u32) -> u64 {
    let key = BucketKey::from_words(head, tail);
    let map = (&raw const CPU_SLOTS).cast::<c_void>().cast_mut();
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        // SAFETY: the map is CPU_SLOTS and the key a u32 index.
        let p = unsafe { bpf_map_lookup_percpu_elem(map, (&raw const index).cast(), cpu) }.cast::<CpuSlot>();
        if p.is_null() {
            continue;
        }
        // SAFETY: another CPU's live entry: read its key and swap its word.
        let (word, s) = unsafe { (&raw mut (*p).word, &*p) };
        // SAFETY: as above.
        let w = unsafe { read_volatile(word) };
        let c = s.stealable(w, &key);
        if c != 0
            && swap(word, w, w & !CREDIT_MASK)
            && let Some(b) = BUCKETS.get_ptr_mut(key)
        {
            refund(b, c);
        }
    }
    0
}
