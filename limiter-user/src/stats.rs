//! Counter totals read from the per-CPU `STATS` array.

use limiter_common::{Counter, REASON_COUNT, Reason, Verdict};

/// Packets and bytes per reason (and per reason and stat family), summed
/// over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub by_reason: [Counter; REASON_COUNT],
    /// `[reason][family]`, family 0 = not IP, 1 = IPv4, 2 = IPv6.
    pub by_family: [[Counter; limiter_common::STAT_FAMILIES]; REASON_COUNT],
}

impl Totals {
    #[must_use]
    pub fn get(&self, r: Reason) -> Counter {
        self.by_reason[r as usize]
    }

    fn sum(&self, v: Verdict) -> Counter {
        Reason::ALL.iter().filter(|r| r.verdict() == v).fold(Counter::default(), |a, r| {
            let c = self.get(*r);
            Counter { packets: a.packets + c.packets, bytes: a.bytes + c.bytes }
        })
    }

    #[must_use]
    pub fn passed(&self) -> Counter {
        self.sum(Verdict::Pass)
    }

    #[must_use]
    pub fn dropped(&self) -> Counter {
        self.sum(Verdict::Drop)
    }

    /// `self - earlier`, slot by slot (counters only grow).
    #[must_use]
    pub fn since(&self, earlier: &Totals) -> Totals {
        let mut out = *self;
        for (o, e) in out.by_reason.iter_mut().zip(&earlier.by_reason) {
            o.packets = o.packets.saturating_sub(e.packets);
            o.bytes = o.bytes.saturating_sub(e.bytes);
        }
        for (of, ef) in out.by_family.iter_mut().zip(&earlier.by_family) {
            for (o, e) in of.iter_mut().zip(ef) {
                o.packets = o.packets.saturating_sub(e.packets);
                o.bytes = o.bytes.saturating_sub(e.bytes);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_and_drop_partition_the_reasons() {
        let mut t = Totals::default();
        for (i, c) in t.by_reason.iter_mut().enumerate() {
            c.packets = 1 << i;
            c.bytes = 1;
        }
        assert_eq!(t.passed().packets + t.dropped().packets, (1 << REASON_COUNT) - 1);
        assert_eq!(t.passed().packets & t.dropped().packets, 0);
        assert!(t.passed().packets & (1 << Reason::Admitted as u32) != 0);
        assert!(t.dropped().packets & (1 << Reason::RateLimited as u32) != 0);
    }
}
