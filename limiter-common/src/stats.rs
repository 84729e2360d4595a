//! The counters: `STATS`, one per class, reason and stat family, and
//! what userspace sums them into.

use crate::{Action, MAX_CLASSES, REASON_COUNT, Reason, family};

/// Address-family dimension of `STATS`: one slot per family of
/// [`family::ALL`] (see [`family::slot`]).
pub const STAT_FAMILIES: usize = family::ALL.len();
#[expect(clippy::cast_possible_truncation, reason = "three families")]
const STAT_FAMILIES_U32: u32 = STAT_FAMILIES as u32;

/// The class dimension of `STATS` for packets counted before they are
/// classified: malformed, not IP, or no policy yet.
pub const UNCLASSIFIED: usize = MAX_CLASSES;
/// Entries of `STATS`: one per class (and [`UNCLASSIFIED`]), reason and
/// stat family. One counter per packet, so the program looks up one.
pub const STAT_ENTRIES: usize = (MAX_CLASSES + 1) * REASON_COUNT * STAT_FAMILIES;

/// Slot of `STATS` for a class (`0..=UNCLASSIFIED`), a reason and a
/// [`family`].
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "class <= UNCLASSIFIED, a small constant")]
pub const fn stat_index(class: usize, reason: Reason, family: crate::Family) -> u32 {
    ((class as u32) * REASON_COUNT as u32 + reason as u32) * STAT_FAMILIES_U32 + family::slot(family)
}

/// The class, reason and [`family`] of the `STATS` slot `index`.
#[must_use]
pub const fn stat_slot(index: usize) -> Option<(usize, Reason, crate::Family)> {
    let fam = family::ALL[index % STAT_FAMILIES];
    let reason = (index / STAT_FAMILIES) % REASON_COUNT;
    let class = index / STAT_FAMILIES / REASON_COUNT;
    if class > UNCLASSIFIED {
        return None;
    }
    Some((class, Reason::ALL[reason], fam))
}

/// What a rule class did: its packets in `STATS` summed by action.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Passed: admitted, allowed, or let through when no bucket could be
    /// made (reported as `action="pass"`).
    pub admitted: Counter,
    pub dropped: Counter,
    /// Would have been dropped; passed because the class is in shadow mode.
    pub shadow: Counter,
}

impl ClassCounters {
    /// What was counted under `action`.
    #[must_use]
    pub const fn get(&self, action: Action) -> Counter {
        match action {
            Action::Pass => self.admitted,
            Action::Drop => self.dropped,
            Action::ShadowDrop => self.shadow,
        }
    }

    /// The slot of `action`.
    #[inline(always)]
    pub fn slot(&mut self, action: Action) -> &mut Counter {
        match action {
            Action::Pass => &mut self.admitted,
            Action::Drop => &mut self.dropped,
            Action::ShadowDrop => &mut self.shadow,
        }
    }
}

impl core::ops::AddAssign for ClassCounters {
    fn add_assign(&mut self, o: Self) {
        self.admitted += o.admitted;
        self.dropped += o.dropped;
        self.shadow += o.shadow;
    }
}

/// One slot of [`crate::maps::STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

impl Counter {
    /// `self - earlier` (counters only grow; saturates at zero).
    #[must_use]
    pub const fn since(self, earlier: Counter) -> Counter {
        Counter {
            packets: self.packets.saturating_sub(earlier.packets),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

impl core::ops::AddAssign for Counter {
    fn add_assign(&mut self, o: Self) {
        self.packets += o.packets;
        self.bytes += o.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class, reason and family has a slot of its own inside
    /// `STATS`, and the slot gives them back.
    #[test]
    fn stat_slots_are_distinct_and_invertible() {
        let mut seen = [false; STAT_ENTRIES];
        for class in 0..=UNCLASSIFIED {
            for reason in Reason::ALL {
                for fam in family::ALL {
                    let i = stat_index(class, reason, fam) as usize;
                    assert!(i < STAT_ENTRIES && !seen[i], "{class} {reason:?} {fam:?}");
                    seen[i] = true;
                    assert_eq!(stat_slot(i), Some((class, reason, fam)));
                }
            }
        }
        assert_eq!(stat_slot(STAT_ENTRIES), None);
    }
}
