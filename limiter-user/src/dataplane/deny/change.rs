//! A change of the set as the kernel writes it: the entries touched
//! since the last one (networks, markers, owner records), and the prefix
//! lengths in use before, during and after.

use limiter_common::deny::{DenyLens, OWNER};

use super::{DenySet, DenyWrites, owner_key, past_lowest};

impl DenySet {
    /// The change built since the last call, to write.
    pub fn finish(&mut self) -> DenyWrites {
        let mut ch = DenyWrites::default();
        for (k, (was, was_owners)) in std::mem::take(&mut self.before) {
            let now = self.value(&k);
            if was != now {
                if now == 0 { ch.deletes.push(k) } else { ch.upserts.push((k, now)) }
            }
            // Its owner records: one for each origin past the lowest.
            let now_owners = past_lowest(self.nets.get(&k).copied().unwrap_or(0));
            let mut moved = past_lowest(was_owners) ^ now_owners;
            while moved != 0 {
                let i = moved.trailing_zeros();
                let origin = u8::try_from(i).unwrap_or(u8::MAX);
                if now_owners & (1 << i) != 0 {
                    ch.upserts.push((owner_key(&k, origin), OWNER | i));
                } else {
                    ch.deletes.push(owner_key(&k, origin));
                }
                moved &= moved - 1;
            }
        }
        let now = self.lens_now();
        if now != self.lens {
            let union = self.lens_union(&now);
            if union != self.lens {
                ch.lens_during = Some(union);
            }
            if union != now {
                ch.lens_after = Some(now);
            }
            self.lens = now;
        }
        ch
    }

    /// The lengths in use now.
    fn lens_now(&self) -> DenyLens {
        let used = |s: usize| (0u8..=128).filter(move |l| self.counts[s][usize::from(*l)] > 0);
        DenyLens::from_lens(used(0), used(1)).unwrap_or_default()
    }

    /// The lengths in force or in `now`.
    fn lens_union(&self, now: &DenyLens) -> DenyLens {
        let of = |l: &[u8]| l.iter().copied().take_while(|x| *x != limiter_common::deny::END).collect::<Vec<_>>();
        let merge = |a: &[u8], b: &[u8]| {
            let mut v: Vec<u8> = of(a).into_iter().chain(of(b)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (v4, v6) = (merge(&self.lens.v4, &now.v4), merge(&self.lens.v6, &now.v6));
        // Two lists of at most MAX_LENS IPv6 lengths each may not fit
        // together: then the old ones are dropped first (a moment in which
        // the networks of a length about to go are not asked).
        DenyLens::from_lens(v4, v6).unwrap_or(*now)
    }
}
