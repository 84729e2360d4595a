//! Per-CPU leased credit: the hot path of a busy prefix without the shared
//! bucket.
//!
//! When a CPU charges a prefix's bucket and the bucket holds plenty, the
//! same compare-and-swap also takes a *lease*: `lease` more of the
//! bucket's allowance (in 1/16 ns of `tat`, like every charge), kept in
//! this CPU's [`CpuSlot`] for the bucket. The prefix's next packets on
//! that CPU are admitted from the slot, without the shared LRU lookup or
//! the compare-and-swap, until the lease is spent, expires (`lease` after
//! it was taken) or the policy version changes.
//!
//! # The bound
//!
//! A lease is charged to the bucket before it is spent, and no credit is
//! ever dropped: it is spent, or given back to the bucket (by its CPU when
//! the slot is reused or the lease ends, or by another CPU, see below).
//! Each CPU holds at most one lease per bucket (a key has one slot per
//! CPU). So over any interval `T` the admitted cost is at most
//! `burst + rate x T + cpus x lease`: what the bucket lets be charged in
//! `T`, plus what was leased before `T` began and spent during it
//! (`tests::leases_keep_the_bound_and_refuse_no_conforming_packet`).
//! [`lease`] keeps `lease` at most 1/16 of the burst and 16 ms of the
//! rate.
//!
//! # No compliant source refused for another CPU's credit
//!
//! - A lease is taken only while the bucket would still hold the packet
//!   plus `cpus x lease` ([`admit`]): near its limit a bucket is charged
//!   packet by packet, exactly as without leases.
//! - A CPU that the bucket refuses first takes back the unspent credit of
//!   the other CPUs' slots for this bucket ([`CpuSlot::stealable`]), gives
//!   it back to the bucket and charges again. A lease taken by another CPU
//!   after that leaves at least `lease` in the bucket, and `lease` is at
//!   least the largest packet's cost, so it cannot cause the refusal.
//!
//! # Single CPU
//!
//! The packets a lease admits would each have been admitted by the bucket
//! charged one by one (the lease left the bucket at least `lease` short of
//! full). What a lease changes is when the credit is charged, which makes
//! later verdicts at most `lease` more generous (the bound above). A lease
//! is only taken when it covers at least two of the largest packets, so
//! slow prefixes (under 128 packets a second with a 16 ms lease, or a
//! burst under 32) are charged packet by packet as before.
//!
//! # Groups
//!
//! A rate group's budget is leased the same way to each CPU (its
//! [`crate::groups::GroupHits`] entry), and a grouped prefix's lease admits
//! only while this CPU's lease of the group holds the packet too: the
//! group admits at most `burst + rate x T + cpus x lease`. No CPU takes
//! back another's lease of a group.
//!
//! # The slot word
//!
//! Other CPUs may only zero a slot's credit, with compare-and-swap on
//! [`CpuSlot::word`], which holds a sequence number beside the credit.
//! The owner changes the slot's other fields only while its credit is zero
//! and bumps the sequence when it stores new credit, so a CPU that read
//! the key and then swapped the word knows the key it read was the
//! credit's.

use crate::{BucketKey, Reason, gcra};

/// Longest lease: 16 ms of the prefix's rate (in 1/16 ns of `tat`).
pub const MAX_LEASE: u64 = gcra::to_fixed(16_000_000);
/// A lease is at most `burst >> BURST_SHIFT` (1/16 of the burst).
pub const BURST_SHIFT: u32 = 4;
/// Largest frame a byte-cost packet may be: XDP without fragments sees one
/// page at most.
pub const MAX_FRAME: u64 = 16_384;
/// Most CPUs whose slots a refused packet looks through. On hosts with
/// more possible CPUs, no lease is taken (every packet is charged to the
/// bucket, as before leases).
pub const MAX_CPUS: u32 = 64;

/// Bits of [`CpuSlot::word`] that hold the credit; the sequence is above.
pub const CREDIT_BITS: u32 = 40;
pub const CREDIT_MASK: u64 = (1 << CREDIT_BITS) - 1;

/// [`CpuSlot::flags`] bits.
pub mod slot_flags {
    /// A lease (else a cached refusal).
    pub const LEASE: u32 = 1;
    /// The refusing class is in shadow mode.
    pub const SHADOW: u32 = 2;
    /// The lease's class charges bytes: a packet costs `len x unit`.
    pub const BYTES: u32 = 4;
    /// A cached denial (an override's or the deny set's, `unit` naming the
    /// deny set's origin, or `u64::MAX`), until the policy or the set
    /// changes.
    pub const DENIED: u32 = 8;
    /// The bucket holds finer denied networks: the packet's address is
    /// asked first, and the bucket is charged without a lease.
    pub const FINER: u32 = 16;
    /// An address the deny set denies (inside a bucket with finer denied
    /// networks): its key has [`ADDRESS`](super::ADDRESS) as prefix
    /// length and the address's first 64 bits, `unit` its last 64, `pad`
    /// the origin.
    pub const ADDRESS: u32 = 32;
}

/// The prefix length of an address's entry ([`slot_flags::ADDRESS`]): no
/// bucket's.
pub const ADDRESS: u8 = u8::MAX;

/// The lease a CPU takes of a bucket of `tau` whose unit costs `unit` (all
/// in 1/16 ns), or 0 when leases are off for it: unless it covers two of
/// the largest packets, or the host has more than [`MAX_CPUS`].
#[inline(always)]
#[must_use]
pub const fn lease(unit: u64, tau: u64, bytes: bool, cpus: u32) -> u64 {
    if cpus == 0 || cpus > MAX_CPUS {
        return 0;
    }
    let l = if tau >> BURST_SHIFT < MAX_LEASE { tau >> BURST_SHIFT } else { MAX_LEASE };
    let largest = if bytes { unit.saturating_mul(MAX_FRAME) } else { unit };
    if l >= largest.saturating_mul(2) { l } else { 0 }
}

/// The GCRA step of [`gcra::admit`] that may also take a lease: `Some((new
/// tat, leased))`. A lease is taken only if the bucket would still hold
/// this packet and `cpus x lease` more.
#[inline(always)]
#[must_use]
pub const fn admit(tat: u64, now: u64, inc: u64, tau: u64, lease: u64, cpus: u32) -> Option<(u64, bool)> {
    if lease != 0 {
        let base = if tat > now { tat } else { now };
        let room = base.saturating_add(inc).saturating_add(lease.saturating_mul(cpus as u64));
        if room - now <= tau {
            return Some((base + inc + lease, true));
        }
    }
    match gcra::admit(tat, now, inc, tau) {
        Some(t) => Some((t, false)),
        None => None,
    }
}

/// One entry of the per-CPU `CPU_SLOTS` map, for the bucket of `key`
/// under policy `version`: either a cached refusal (the bucket refuses
/// every packet of the same cost until `until`; see the program) or a
/// lease (credit in [`Self::word`], good until `until`).
///
/// A bucket's `tat` never falls below what it was when a refusal was seen:
/// refused packets leave it alone, admitted ones raise it, and credit
/// given back only returns what a lease taken later added. So a refusal
/// seen at `tat` holds for the same charge `inc` while
/// `now < tat + inc - tau`. Refusals are only cached where `tat` cannot go
/// down otherwise (packet cost, aggregate tier off).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSlot {
    pub key: BucketKey,
    /// Low 32 bits of the policy version when the entry was made.
    pub version: u32,
    /// Refusal: refuses until. Lease: expires at. 1/16 ns.
    pub until: u64,
    /// `sequence << CREDIT_BITS | credit`: the lease's unspent credit in
    /// 1/16 ns. Changed with compare-and-swap only.
    pub word: u64,
    /// Lease: the charge of one unit of cost ([`crate::ClassLimits::unit`]).
    pub unit: u64,
    /// [`slot_flags`].
    pub flags: u32,
    /// An address's denial: the deny set's origin. Otherwise zero.
    pub pad: u32,
}

/// Slots per CPU in the `CPU_SLOTS` map (a power of two).
pub const CPU_SLOTS_ENTRIES: u32 = 1024;

impl CpuSlot {
    /// The `CPU_SLOTS` index of `key`: a multiplicative hash of its
    /// fields, top bits kept.
    #[inline(always)]
    #[must_use]
    pub const fn index(key: &BucketKey) -> u32 {
        let h = key.addr[0] ^ key.addr[1].rotate_left(16) ^ ((key.class as u32) << 8 | key.prefix_len as u32);
        h.wrapping_mul(0x9e37_79b1) >> (32 - CPU_SLOTS_ENTRIES.trailing_zeros())
    }

    /// Whether this entry is `key`'s under `version` and still good at `now`.
    #[inline(always)]
    #[must_use]
    pub fn is_for(&self, key: &BucketKey, version: u32, now: u64) -> bool {
        now < self.until && self.version == version && self.key == *key
    }

    /// The reason a cached refusal gives, if the entry is one.
    #[inline(always)]
    #[must_use]
    pub const fn refusal(&self) -> Option<Reason> {
        if self.flags & (slot_flags::LEASE | slot_flags::FINER) != 0 {
            return None;
        }
        Some(if self.flags & slot_flags::DENIED != 0 {
            Reason::Denied
        } else if self.flags & slot_flags::SHADOW != 0 {
            Reason::ShadowDropped
        } else {
            Reason::RateLimited
        })
    }

    /// The charge of a packet of `len` bytes under this lease.
    #[inline(always)]
    #[must_use]
    pub const fn inc(&self, len: u64) -> u64 {
        if self.flags & slot_flags::BYTES != 0 { len * self.unit } else { self.unit }
    }

    /// The credit another CPU may take back from `word` for `key`'s
    /// bucket: nonzero only if the slot holds credit for that key.
    #[inline(always)]
    #[must_use]
    pub fn stealable(&self, word: u64, key: &BucketKey) -> u64 {
        if word & CREDIT_MASK == 0 || self.key != *key { 0 } else { word & CREDIT_MASK }
    }
}

/// The word after spending `inc` of its credit, if it holds that much.
#[inline(always)]
#[must_use]
pub const fn spend(word: u64, inc: u64) -> Option<u64> {
    if word & CREDIT_MASK >= inc { Some(word - inc) } else { None }
}

/// The word that holds `credit` after `word`: the next sequence number,
/// so a CPU that read the slot before cannot swap it.
#[inline(always)]
#[must_use]
pub const fn restock(word: u64, credit: u64) -> u64 {
    ((word >> CREDIT_BITS).wrapping_add(1) << CREDIT_BITS) | (credit & CREDIT_MASK)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    /// A model of the program's use of these functions: one bucket, one
    /// slot per CPU, every packet charged as the program does (spend the
    /// slot, else charge the bucket, taking a lease when [`admit`] allows;
    /// a refused CPU takes back the others' credit and charges again).
    /// Returns which packets were admitted.
    fn run(rate: u64, burst: u64, cpus: u32, arrivals: &[(u64, usize)]) -> Vec<bool> {
        let unit = gcra::unit_interval(rate);
        let tau = gcra::tau(burst, unit).unwrap();
        let l = lease(unit, tau, false, cpus);
        let mut tat = 0u64;
        // (credit, until) per CPU.
        let mut slots = std::vec![(0u64, 0u64); cpus as usize];
        arrivals
            .iter()
            .map(|&(t, cpu)| {
                let now = gcra::to_fixed(t);
                let (credit, until) = &mut slots[cpu];
                if now < *until && *credit >= unit {
                    *credit -= unit;
                    return true;
                }
                // The slow path gives back what this CPU's slot holds.
                tat = tat.saturating_sub(core::mem::take(credit));
                if let Some((next, leased)) = admit(tat, now, unit, tau, l, cpus) {
                    tat = next;
                    if leased {
                        slots[cpu] = (l, now + l);
                    }
                    return true;
                }
                let stolen: u64 = slots.iter_mut().map(|s| core::mem::take(&mut s.0)).sum();
                tat = tat.saturating_sub(stolen);
                match gcra::admit(tat, now, unit, tau) {
                    Some(next) => {
                        tat = next;
                        true
                    }
                    None => false,
                }
            })
            .collect()
    }

    /// Arrival times (ns, sorted), each on a CPU: runs of packets on one
    /// CPU, so a CPU often holds a lease while the others go on.
    fn arrivals(max_gap: u64, cpus: usize) -> impl Strategy<Value = Vec<(u64, usize)>> {
        prop::collection::vec((0..max_gap, 0..cpus, 0..100u32), 1..800).prop_map(|v| {
            let (mut t, mut on) = (1_000_000_000u64, 0);
            v.into_iter()
                .map(|(gap, cpu, dice)| {
                    t += gap;
                    if dice < 4 {
                        on = cpu;
                    }
                    (t, on)
                })
                .collect()
        })
    }

    /// Token-bucket conformance at an exact rate (units per second), in
    /// integers: tokens scaled by 1e9.
    fn conforms(rate: u64, burst: u64, times: &[u64]) -> bool {
        let cap = u128::from(burst) * 1_000_000_000;
        let (mut tokens, mut last) = (cap, times.first().copied().unwrap_or(0));
        for &t in times {
            tokens = (tokens + u128::from(t - last) * u128::from(rate)).min(cap);
            last = t;
            if tokens < 1_000_000_000 {
                return false;
            }
            tokens -= 1_000_000_000;
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn leases_keep_the_bound_and_refuse_no_conforming_packet(
            rate in prop::sample::select(std::vec![1_000u64, 10_000, 100_000, 1_000_000]),
            burst in 32u64..5_000,
            cpus in 1u32..5,
            seq in arrivals(300_000, 4),
            window_ms in 1u64..200,
        ) {
            let seq: Vec<(u64, usize)> = seq.into_iter().map(|(t, c)| (t, c % cpus as usize)).collect();
            let unit = gcra::unit_interval(rate);
            let l = lease(unit, gcra::tau(burst, unit).unwrap(), false, cpus);
            let adm = run(rate, burst, cpus, &seq);
            // The bound: burst + rate x W + cpus x lease, in whole packets.
            let w = window_ms * 1_000_000;
            let times: Vec<u64> = seq.iter().zip(&adm).filter(|(_, a)| **a).map(|(s, _)| s.0).collect();
            let busiest = (0..times.len())
                .map(|i| times[i..].iter().take_while(|t| **t < times[i] + w).count() as u64)
                .max()
                .unwrap_or(0);
            let bound = burst + (rate * w).div_ceil(gcra::NS_PER_S) + (u64::from(cpus) * l).div_ceil(unit);
            prop_assert!(busiest <= bound, "admitted {busiest} > {bound} in {window_ms} ms");
            // The conforming part of the sequence, on the same CPUs, loses nothing.
            let mut kept: Vec<(u64, usize)> = Vec::new();
            for a in seq {
                kept.push(a);
                let t: Vec<u64> = kept.iter().map(|k| k.0).collect();
                if !conforms(rate, burst, &t) {
                    kept.pop();
                }
            }
            let adm = run(rate, burst, cpus, &kept);
            prop_assert!(adm.iter().all(|a| *a), "a conforming packet was refused");
        }
    }

    #[test]
    fn lease_size_follows_rate_burst_and_cpus() {
        let unit = gcra::unit_interval(1000); // 1 ms
        // 1/16 of a burst of 200: 12.5 packets.
        assert_eq!(lease(unit, 200 * unit, false, 2), 200 * unit / 16);
        // Capped at 16 ms of the rate.
        assert_eq!(lease(unit, 100_000 * unit, false, 2), MAX_LEASE);
        // Under two packets: none. Too many CPUs, or unknown: none.
        assert_eq!(lease(unit, 31 * unit, false, 2), 0);
        assert_eq!(lease(unit, 200 * unit, false, MAX_CPUS + 1), 0);
        assert_eq!(lease(unit, 200 * unit, false, 0), 0);
        // Bytes: two of the largest frames must fit.
        let per_byte = gcra::unit_interval(100_000_000);
        assert_eq!(lease(per_byte, per_byte * 1_000_000, true, 2), per_byte * 1_000_000 / 16);
        assert_eq!(lease(per_byte, per_byte * 500_000, true, 2), 0);
    }

    #[test]
    fn a_lease_is_taken_only_with_room_for_every_cpu() {
        let (unit, tau, l) = (16, 16 * 100, 16 * 10);
        // Full bucket: room for the packet and 4 leases of 10.
        assert_eq!(admit(0, 1000, unit, tau, l, 4), Some((1000 + unit + l, true)));
        // 40 units left: the packet alone (a lease needs 1 + 4 x 10); 41
        // left: the packet and a lease; none left: refused.
        assert_eq!(admit(1000 + 16 * 60, 1000, unit, tau, l, 4), Some((1000 + 16 * 61, false)));
        assert_eq!(admit(1000 + 16 * 59, 1000, unit, tau, l, 4), Some((1000 + 16 * 70, true)));
        assert_eq!(admit(1000 + tau, 1000, unit, tau, l, 4), None);
    }

    #[test]
    fn words_keep_their_sequence_apart_from_their_credit() {
        let w = restock(0, 500);
        assert_eq!(w & CREDIT_MASK, 500);
        assert_eq!(spend(w, 200), Some(restock(0, 300)));
        assert_eq!(spend(w, 501), None);
        assert_ne!(restock(w, 500), w, "a new lease of the same size is a new word");
        assert_eq!(restock(u64::MAX, 1) & CREDIT_MASK, 1);
    }
}
