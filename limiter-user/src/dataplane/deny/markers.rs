//! The set's markers when the bucket prefixes change, and the set read
//! back from the pins (markers recomputed, a cut write mended).

use std::collections::HashMap;

use limiter_common::deny::{DENIED, DenyKey, FINER, OWNER, OWNER_KEY};

use super::{DenySet, DenyWrites, Pinned, slot};

impl DenySet {
    /// The set as the kernel holds it (its pinned entries, origins'
    /// names and lengths in force), and the change that brings the kernel
    /// to what it should hold (markers under buckets of `v4`/`v6` bits,
    /// the lengths in use): nothing, unless a write was cut short.
    #[must_use]
    pub fn restore(capacity: usize, bucket: (u8, u8), pinned: Pinned) -> (Self, DenyWrites) {
        let mut s = Self::new(capacity, bucket.0, bucket.1);
        s.names = pinned.names;
        let mut kernel_markers = Vec::new();
        let mut owners = Vec::new();
        for (k, v) in pinned.entries {
            if k.pad[0] == OWNER_KEY {
                owners.push((k, v));
                continue;
            }
            if v & FINER != 0 {
                kernel_markers.push(k);
                s.markers.insert(k, 1);
            }
            let origin = v & limiter_common::deny::ORIGIN;
            if v & DENIED != 0 && origin < 64 {
                s.nets.insert(k, 1 << origin);
                s.per_origin[origin as usize] += 1;
                s.counts[slot(k.family)][usize::from(k.len.min(128))] += 1;
            }
        }
        // Every origin of a network several deny (its owner records); a
        // record whose network is gone (a write a crash cut short) goes.
        let mut orphans = Vec::new();
        for (k, v) in owners {
            let net = DenyKey { pad: [0; 2], ..k };
            let origin = k.pad[1];
            match s.nets.get_mut(&net) {
                Some(o)
                    if v & OWNER != 0 && origin < 64 && *o & (1 << origin) == 0 && *o & ((1 << origin) - 1) != 0 =>
                {
                    *o |= 1 << origin;
                    s.per_origin[usize::from(origin)] += 1;
                    s.shared += 1;
                }
                _ => orphans.push(k),
            }
        }
        s.lens = pinned.lens;
        let mut fresh: HashMap<DenyKey, u32> = HashMap::new();
        for k in s.nets.keys() {
            if let Some(m) = s.marker_of(k) {
                *fresh.entry(m).or_default() += 1;
            }
        }
        for m in kernel_markers.iter().chain(fresh.keys()) {
            s.touch(*m);
        }
        s.markers = fresh;
        let mut ch = s.finish();
        ch.deletes.extend(orphans);
        (s, ch)
    }

    /// Markers under buckets of `v4`/`v6` bits from now on: the new ones
    /// are added (a first change, to write before the policy's switch),
    /// and the old ones removed (a second, to write after it).
    pub fn set_bucket(&mut self, v4: u8, v6: u8) -> (DenyWrites, DenyWrites) {
        let old = std::mem::take(&mut self.markers);
        self.bucket = [v4, v6];
        let finer: Vec<DenyKey> = self.nets.keys().copied().collect();
        let mut fresh: HashMap<DenyKey, u32> = HashMap::new();
        for k in &finer {
            if let Some(m) = self.marker_of(k) {
                *fresh.entry(m).or_default() += 1;
            }
        }
        // First: both the old and the new markers.
        self.markers.clone_from(&old);
        for m in fresh.keys() {
            self.touch(*m);
        }
        for (m, n) in &fresh {
            *self.markers.entry(*m).or_default() += n;
        }
        let first = self.finish();
        for m in old.keys().chain(fresh.keys()) {
            self.touch(*m);
        }
        self.markers = fresh;
        let second = self.finish();
        (first, second)
    }
}
