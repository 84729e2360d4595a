//! Top offenders: prefixes with the most drops over the last seconds,
//! from sampled drop events (one in `drop_sample` drops, drawn at random,
//! reaches the `DROP_EVENTS` ring buffer). Memory is bounded: at most `MAX_KEYS`
//! prefixes per one-second slot and `WINDOW_SECS` slots; the LRU map is
//! never walked.

use std::collections::{HashMap, VecDeque};

use limiter_common::BucketKey;

/// Seconds of drops the list covers.
pub const WINDOW_SECS: u64 = 10;
/// Prefixes kept per one-second slot; the smallest is forgotten first.
pub const MAX_KEYS: usize = 1_000;
/// Seconds of pass/drop history kept for sparklines.
pub const HISTORY_SECS: usize = 60;
/// One drop in this many, at random, is sampled.
pub const DROP_SAMPLE: u32 = limiter_common::DROP_SAMPLE;

/// Aggregated drop samples and per-second totals.
#[derive(Debug, Default)]
pub struct Tracker {
    slots: VecDeque<(u64, HashMap<BucketKey, u64>)>,
    /// (second, passed, dropped) packets per second.
    history: VecDeque<(u64, u64, u64)>,
}

impl Tracker {
    /// Count one sampled drop of `key` at second `now`.
    pub fn record(&mut self, now: u64, key: BucketKey) {
        if self.slots.back().is_none_or(|(s, _)| *s != now) {
            self.slots.push_back((now, HashMap::new()));
        }
        while self.slots.front().is_some_and(|(s, _)| s + WINDOW_SECS <= now) {
            self.slots.pop_front();
        }
        let slot = &mut self.slots.back_mut().expect("pushed above").1;
        if slot.len() >= MAX_KEYS && !slot.contains_key(&key) {
            // Bounded: forget this second's smallest entry.
            if let Some(min) = slot.iter().min_by_key(|(_, n)| **n).map(|(k, _)| *k) {
                slot.remove(&min);
            }
        }
        *slot.entry(key).or_default() += u64::from(DROP_SAMPLE);
    }

    /// Note the packets passed and dropped during second `now`.
    pub fn tick(&mut self, now: u64, passed: u64, dropped: u64) {
        self.history.push_back((now, passed, dropped));
        while self.history.len() > HISTORY_SECS {
            self.history.pop_front();
        }
    }

    /// Per-second (passed, dropped), oldest first.
    #[must_use]
    pub fn history(&self) -> Vec<(u64, u64)> {
        self.history.iter().map(|(_, p, d)| (*p, *d)).collect()
    }

    /// The `n` prefixes with the most estimated drops per second over the
    /// window ending at `now`, most first.
    #[must_use]
    pub fn offenders(&self, now: u64, n: usize) -> Vec<(BucketKey, u64)> {
        let mut sum: HashMap<BucketKey, u64> = HashMap::new();
        let mut oldest = now;
        for (s, m) in &self.slots {
            if s + WINDOW_SECS > now {
                oldest = oldest.min(*s);
                for (k, c) in m {
                    *sum.entry(*k).or_default() += c;
                }
            }
        }
        // Average over the seconds the samples cover, up to the window.
        let span = (now - oldest + 1).min(WINDOW_SECS);
        let mut v: Vec<(BucketKey, u64)> = sum.into_iter().map(|(k, c)| (k, c / span)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.addr.cmp(&b.0.addr)));
        v.truncate(n);
        v
    }
}

pub use crate::dataplane::cidr;

/// Eight-level bar chart of `values` scaled to their maximum.
#[must_use]
pub fn sparkline(values: &[u64]) -> String {
    bars(values, ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'])
}

/// [`sparkline`] in ASCII, for a terminal whose locale is not UTF-8.
#[must_use]
pub fn ascii_sparkline(values: &[u64]) -> String {
    bars(values, ['_', '.', '-', ':', '=', '+', '*', '#'])
}

fn bars(values: &[u64], bars: [char; 8]) -> String {
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values.iter().map(|v| bars[usize::try_from(v * 7 / max).unwrap_or(7).min(7)]).collect()
}

#[cfg(test)]
mod tests {
    use limiter_common::family;

    use super::*;

    fn key(last: u8) -> BucketKey {
        BucketKey {
            family: family::IPV4,
            prefix_len: 24,
            class: 0,
            pad: 0,
            addr: [u32::from_ne_bytes([198, 18, last, 0]), 0],
        }
    }

    #[test]
    fn ranks_by_drops_in_the_window_and_forgets_old_seconds() {
        let mut t = Tracker::default();
        for _ in 0..30 {
            t.record(100, key(1));
        }
        for _ in 0..10 {
            t.record(105, key(2));
        }
        let top = t.offenders(105, 5);
        assert_eq!(top.iter().map(|(k, _)| cidr(k)).collect::<Vec<_>>(), ["198.18.1.0/24", "198.18.2.0/24"]);
        // Samples cover seconds 100..=105: six seconds.
        assert_eq!(top[0].1, 30 * u64::from(DROP_SAMPLE) / 6);
        // Ten seconds on, the first burst has left the window.
        assert_eq!(t.offenders(110, 5).iter().map(|(k, _)| cidr(k)).collect::<Vec<_>>(), ["198.18.2.0/24"]);
    }

    #[test]
    fn memory_stays_bounded_under_spoofed_sources() {
        let mut t = Tracker::default();
        for i in 0..100_000u32 {
            let mut k = key(0);
            k.addr[0] = i;
            t.record(7, k);
        }
        assert!(t.slots.iter().all(|(_, m)| m.len() <= MAX_KEYS));
    }

    #[test]
    fn sparkline_scales_to_the_maximum() {
        assert_eq!(sparkline(&[0, 7, 14]), "▁▄█");
        assert_eq!(ascii_sparkline(&[0, 7, 14]), "_:#");
        assert_eq!(sparkline(&[]), "");
    }
}
