//! Automatic escalation (`[feedback.escalate]`, off by default): a prefix
//! whose own bucket keeps dropping it above `drops_per_sec` for
//! `sustained` is denied for `deny_for`, through the feedback governor
//! (its cap, minimum prefix length, longest TTL and shadow mode apply).
//!
//! The rate is estimated from the sampled drop events (one drop in
//! `DROP_SAMPLE` per CPU reaches the ring buffer), only those of reason
//! `rate_limited`: a prefix already denied does not count again. Memory
//! is bounded: at most `MAX_KEYS` prefixes a second are tracked.

use std::collections::HashMap;

use limiter_common::{BucketKey, DROP_SAMPLE};

use crate::policy::feedback::Escalate;

/// Prefixes tracked a second; samples of more are not counted.
const MAX_KEYS: usize = 1_000;
/// Most escalations asked for in one second (the rest wait a second).
const MAX_PER_SECOND: usize = 16;

#[derive(Debug, Default)]
pub(super) struct Escalator {
    /// Rate-limited drop samples since the last tick, per prefix.
    samples: HashMap<BucketKey, u64>,
    /// Consecutive seconds above the threshold, per prefix.
    streaks: HashMap<BucketKey, u64>,
    /// Prefixes escalated, with the Unix time their deny ends: not asked
    /// again before then.
    escalated: HashMap<BucketKey, u64>,
}

impl Escalator {
    /// One sampled rate-limited drop of `key` (any class: a prefix is
    /// escalated as a whole).
    pub fn record(&mut self, key: BucketKey) {
        let key = BucketKey { class: 0, ..key };
        if self.samples.len() < MAX_KEYS || self.samples.contains_key(&key) {
            *self.samples.entry(key).or_default() += 1;
        }
    }

    /// Once a second, at Unix time `now`: the prefixes to deny now (above
    /// the rate in each of the last `sustained` whole seconds), each with
    /// its estimated drops a second.
    pub fn second(&mut self, rule: Option<&Escalate>, now: u64) -> Vec<(BucketKey, u64)> {
        let samples = std::mem::take(&mut self.samples);
        let Some(rule) = rule else {
            self.streaks.clear();
            self.escalated.clear();
            return Vec::new();
        };
        self.escalated.retain(|_, until| *until > now);
        let mut streaks = HashMap::new();
        let mut out = Vec::new();
        for (k, n) in samples {
            let rate = n * u64::from(DROP_SAMPLE);
            if rate < rule.drops_per_sec {
                continue;
            }
            let streak = self.streaks.get(&k).copied().unwrap_or(0) + 1;
            // The first second of a streak may be partial: a streak of
            // `sustained` + 1 seconds holds `sustained` whole ones.
            if streak > rule.sustained.as_secs() && out.len() < MAX_PER_SECOND && !self.escalated.contains_key(&k) {
                self.escalated.insert(k, now + rule.deny_for.as_secs());
                out.push((k, rate));
                continue;
            }
            streaks.insert(k, streak);
        }
        self.streaks = streaks;
        out.sort_by_key(|(k, _)| k.addr);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_common::family;

    use super::*;

    fn key(last: u32, class: u8) -> BucketKey {
        BucketKey { family: family::IPV4, prefix_len: 24, class, pad: 0, addr: [last, 0] }
    }

    fn feed(e: &mut Escalator, k: BucketKey, drops: u64) {
        for _ in 0..drops / u64::from(DROP_SAMPLE) {
            e.record(k);
        }
    }

    #[test]
    fn only_a_prefix_above_the_rate_for_the_whole_time_is_escalated_once() {
        let rule = Escalate {
            drops_per_sec: 6400,
            sustained: Duration::from_secs(3),
            deny_for: Duration::from_secs(10),
            max_denied: 100,
        };
        let mut e = Escalator::default();
        let (flood, gap, low) = (key(1, 0), key(2, 0), key(3, 1));
        let mut seen = Vec::new();
        for now in 100..107 {
            // Split over two classes: counted as one prefix.
            feed(&mut e, flood, 3200);
            feed(&mut e, BucketKey { class: 2, ..flood }, 3200);
            // Above, but one quiet second breaks the streak.
            if now != 101 {
                feed(&mut e, gap, 20_000);
            }
            feed(&mut e, low, 6000);
            seen.push(e.second(Some(&rule), now));
        }
        // The first second may be partial: 3 whole seconds take 4 ticks.
        assert_eq!(seen[0..3], [vec![], vec![], vec![]]);
        assert_eq!(seen[3], vec![(flood, 6400)], "the fourth second above escalates");
        assert_eq!(seen[4], vec![]);
        assert_eq!(seen[5], vec![(gap, 19968)], "four seconds above after the gap");
        assert_eq!(seen[6], vec![], "not asked again while denied");
        // Denied until 113; a prefix still flooding after that is asked again.
        for now in 107..118 {
            if now >= 113 {
                feed(&mut e, flood, 6400);
            }
            seen.push(e.second(Some(&rule), now));
        }
        assert!(seen[7..16].iter().all(Vec::is_empty), "{seen:?}");
        assert_eq!(seen[16], vec![(flood, 6400)], "denied until 113, then four ticks above");
        // Off: nothing, and nothing kept.
        feed(&mut e, flood, 64_000);
        assert_eq!(e.second(None, 200), vec![]);
        assert!(e.streaks.is_empty() && e.escalated.is_empty());
    }

    #[test]
    fn memory_stays_bounded_under_spoofed_sources() {
        let mut e = Escalator::default();
        for i in 0..100_000 {
            e.record(key(i, 0));
        }
        assert_eq!(e.samples.len(), MAX_KEYS);
    }
}
