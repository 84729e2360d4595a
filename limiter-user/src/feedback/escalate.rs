//! Automatic escalation (`[feedback.escalate]`, off by default): a prefix
//! whose own bucket keeps dropping it above `drops_per_sec` for
//! `sustained` is denied for `deny_for`, through the feedback governor
//! (its cap, minimum prefix length, longest TTL and shadow mode apply).
//!
//! The rate is estimated from the sampled drop events (one drop in
//! `DROP_SAMPLE` per CPU reaches the ring buffer), only those of reason
//! `rate_limited`: a prefix already denied does not count again. Only
//! the drops of addresses that proved themselves count (see `proof.rs`):
//! a flood spoofed inside a victim's prefix is dropped as before but
//! never gets the prefix denied. Memory is bounded: at most `MAX_KEYS`
//! prefixes a second are tracked, `MAX_ADDRS` addresses each.

use std::{collections::HashMap, net::IpAddr, time::Instant};

use limiter_common::{BucketKey, DROP_SAMPLE};

use super::proof::Proven;
use crate::policy::feedback::Escalate;

/// Prefixes tracked a second; samples of more are not counted.
const MAX_KEYS: usize = 1_000;
/// Addresses told apart per prefix a second; samples of more count as
/// unproven (a spoofer who fills them only hides drops, never adds any).
const MAX_ADDRS: usize = 256;
/// Most escalations asked for in one second (the rest wait a second).
const MAX_PER_SECOND: usize = 16;

#[derive(Debug, Default)]
pub struct Escalator {
    /// Rate-limited drop samples since the last tick, per prefix and
    /// source address (`None`: past `MAX_ADDRS`, or no address known).
    samples: HashMap<BucketKey, HashMap<Option<IpAddr>, u64>>,
    /// When each prefix's first sample of this second was drained.
    first: HashMap<BucketKey, Instant>,
    /// Addresses that proved themselves.
    pub proven: Proven,
    /// Prefix-seconds above the rate, not escalated because too few of
    /// their drops came from proven addresses.
    pub unproven: u64,
    /// The last second's samples of prefixes above the rate whose drops
    /// were not proven at the tick (judged again at the next).
    unsure: HashMap<BucketKey, HashMap<Option<IpAddr>, u64>>,
    /// Consecutive seconds above the threshold, per prefix.
    streaks: HashMap<BucketKey, u64>,
    /// Prefixes escalated, with the Unix time their deny ends: not asked
    /// again before then.
    escalated: HashMap<BucketKey, u64>,
}

impl Escalator {
    /// With proofs of the kernel's sockets read in the background.
    #[must_use]
    pub fn with_sockets() -> Self {
        Self { proven: Proven::with_sockets(), ..Self::default() }
    }

    /// One sampled rate-limited drop of `key` (any class: a prefix is
    /// escalated as a whole) from `src`.
    pub fn record(&mut self, key: BucketKey, src: Option<IpAddr>) {
        let key = BucketKey { class: 0, ..key };
        if self.samples.len() < MAX_KEYS || self.samples.contains_key(&key) {
            self.first.entry(key).or_insert_with(Instant::now);
            let by = self.samples.entry(key).or_default();
            let src = if by.len() < MAX_ADDRS || by.contains_key(&src) { src } else { None };
            *by.entry(src).or_default() += 1;
            self.proven.wanted();
        }
    }

    /// Once a second, at Unix time `now`: the prefixes to deny now (above
    /// the rate in each of the last `sustained` whole seconds), each with
    /// its estimated drops a second.
    pub fn second(&mut self, rule: Option<&Escalate>, now: u64) -> Vec<(BucketKey, u64)> {
        let samples = std::mem::take(&mut self.samples);
        let first = std::mem::take(&mut self.first);
        self.proven.tick(now);
        let Some(rule) = rule else {
            self.streaks.clear();
            self.escalated.clear();
            return Vec::new();
        };
        self.escalated.retain(|_, until| *until > now);
        let to_rate = |n: u64| n * u64::from(DROP_SAMPLE);
        let proven_rate = |p: &Proven, by: &HashMap<Option<IpAddr>, u64>| {
            to_rate(by.iter().filter(|(a, _)| a.is_some_and(|a| p.contains(&a))).map(|(_, n)| n).sum())
        };
        // The last second's prefixes that were above the rate but not (yet)
        // proven: judged again with the proofs read since (the sockets are
        // read when drops begin, so a proof may land just after the tick).
        for (k, by) in std::mem::take(&mut self.unsure) {
            if proven_rate(&self.proven, &by) >= rule.drops_per_sec {
                *self.streaks.entry(k).or_default() += 1;
            } else {
                self.unproven += 1;
            }
        }
        let mut streaks = HashMap::new();
        let mut out = Vec::new();
        for (k, by) in samples {
            let mut rate = proven_rate(&self.proven, &by);
            // The first second of a streak is partial (the drops began
            // during it): its rate is taken over the part it had drops,
            // from the first sample's drain on (at least 100 ms), so a
            // streak of `sustained` + 1 ticks ends at most `sustained` + 1 s
            // after the drops began. (The drain runs every 200 ms, so this
            // can overstate a first second's rate; the whole seconds that
            // follow must be above the rate on their own.)
            if !self.streaks.contains_key(&k)
                && let Some(t) = first.get(&k)
            {
                let ms = u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX).clamp(100, 1000);
                rate = rate.saturating_mul(1000) / ms;
            }
            if rate < rule.drops_per_sec {
                if to_rate(by.values().sum()) >= rule.drops_per_sec {
                    if let Some(s) = self.streaks.get(&k) {
                        streaks.insert(k, *s);
                    }
                    self.unsure.insert(k, by);
                }
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

    /// The one host of prefix `k` (proven before the run).
    fn host(k: BucketKey) -> IpAddr {
        IpAddr::from(k.addr[0].to_be_bytes())
    }

    fn feed(e: &mut Escalator, k: BucketKey, drops: u64) {
        for _ in 0..drops / u64::from(DROP_SAMPLE) {
            e.record(k, Some(host(k)));
        }
    }

    fn proven(keys: &[BucketKey]) -> Escalator {
        let mut e = Escalator::default();
        for k in keys {
            e.proven.prove(host(*k), 100);
        }
        e
    }

    fn rule() -> Escalate {
        Escalate {
            drops_per_sec: 6400,
            sustained: Duration::from_secs(3),
            deny_for: Duration::from_secs(10),
            max_denied: 100,
        }
    }

    #[test]
    fn only_a_prefix_above_the_rate_for_the_whole_time_is_escalated_once() {
        let rule = rule();
        let (flood, gap, low) = (key(1, 0), key(2, 0), key(3, 1));
        let mut e = proven(&[flood, gap, low]);
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
            e.record(key(i, 0), Some(host(key(i, 0))));
        }
        assert_eq!(e.samples.len(), MAX_KEYS);
        for i in 0..100_000u32 {
            e.record(key(0, 0), Some(IpAddr::from(i.to_be_bytes())));
        }
        assert_eq!(e.samples[&key(0, 0)].len(), MAX_ADDRS + 1, "the rest as one unproven entry");
    }

    /// A flood spoofed inside a prefix whose real host proved itself: only
    /// that host's share of the drops counts, far under the rate, so the
    /// prefix is never escalated (and that is counted); the same flood
    /// from the proven host itself is.
    #[test]
    fn only_the_drops_of_proven_addresses_count() {
        let victim = key(u32::from_be_bytes([198, 18, 11, 0]), 0);
        let real = IpAddr::from([198, 18, 11, 7]);
        let mut e = Escalator::default();
        e.proven.prove(real, 100);
        for now in 100..110 {
            for i in 0..12_800 / DROP_SAMPLE {
                let spoofed = IpAddr::from([198, 18, 11, u8::try_from(i % 256).unwrap()]);
                e.record(victim, Some(spoofed));
            }
            assert_eq!(e.second(Some(&rule()), now), vec![], "at {now}");
        }
        assert_eq!(e.unproven, 9, "ten prefix-seconds above the rate, unproven (the last judged at the next tick)");
        for now in 110..114 {
            for _ in 0..12_800 / DROP_SAMPLE {
                e.record(victim, Some(real));
            }
            let got = e.second(Some(&rule()), now);
            assert_eq!(got, if now == 113 { vec![(victim, 12_800)] } else { vec![] }, "at {now}");
        }
    }
}
