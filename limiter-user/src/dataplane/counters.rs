//! Counter totals read from the per-CPU `STATS` array, and what an
//! operator reads from them: passed, dropped and shadow-dropped by each
//! reason's [`Action`].

use limiter_common::{Action, Counter, REASON_COUNT, Reason, STAT_FAMILIES, family, family::Family};

/// Packets and bytes per reason (and per reason and family), summed over
/// CPUs; read by reason and [`Family`] ([`Self::get`], [`Self::of_family`]),
/// never by position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    by_reason: [Counter; REASON_COUNT],
    /// `[reason][family::slot(family)]`.
    by_family: [[Counter; STAT_FAMILIES]; REASON_COUNT],
}

impl Totals {
    /// Add one slot's sum.
    pub fn add(&mut self, r: Reason, fam: Family, c: Counter) {
        self.by_reason[r as usize] += c;
        self.by_family[r as usize][family::slot(fam) as usize] += c;
    }

    /// What was counted under reason `r` for the [`family`] `fam`.
    #[must_use]
    pub fn of_family(&self, r: Reason, fam: Family) -> Counter {
        self.by_family[r as usize][family::slot(fam) as usize]
    }

    #[must_use]
    pub fn get(&self, r: Reason) -> Counter {
        self.by_reason[r as usize]
    }

    /// Everything counted under reasons of `action`.
    #[must_use]
    pub fn of(&self, action: Action) -> Counter {
        Reason::ALL.iter().filter(|r| r.action() == action).fold(Counter::default(), |mut a, r| {
            a += self.get(*r);
            a
        })
    }

    /// Everything the program let through (shadow drops included: they pass).
    #[must_use]
    pub fn passed(&self) -> Counter {
        let mut c = self.of(Action::Pass);
        c += self.of(Action::ShadowDrop);
        c
    }

    #[must_use]
    pub fn dropped(&self) -> Counter {
        self.of(Action::Drop)
    }

    /// `self - earlier`, slot by slot (counters only grow).
    #[must_use]
    pub fn since(&self, earlier: &Totals) -> Totals {
        let mut out = *self;
        for (o, e) in out.by_reason.iter_mut().zip(&earlier.by_reason) {
            *o = o.since(*e);
        }
        for (of, ef) in out.by_family.iter_mut().zip(&earlier.by_family) {
            for (o, e) in of.iter_mut().zip(ef) {
                *o = o.since(*e);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::Verdict;

    use super::*;

    #[test]
    fn pass_and_drop_partition_the_reasons_by_verdict() {
        let mut t = Totals::default();
        for (i, r) in Reason::ALL.iter().enumerate() {
            t.add(*r, family::ALL[i % STAT_FAMILIES], Counter { packets: 1 << i, bytes: 1 });
        }
        assert_eq!(t.passed().packets + t.dropped().packets, (1 << REASON_COUNT) - 1);
        assert_eq!(t.passed().packets & t.dropped().packets, 0);
        for r in Reason::ALL {
            let bit = 1 << r as u32;
            let passed = t.passed().packets & bit != 0;
            assert_eq!(passed, r.verdict() == Verdict::Pass, "{r:?}");
        }
        assert_eq!(t.of(Action::ShadowDrop).packets, 1 << Reason::ShadowDropped as u32);
        assert_eq!(t.since(&t), Totals::default());
    }
}
