//! Automatic escalation (`[feedback.escalate]`, off by default): a proven
//! address whose packets its bucket keeps dropping above `drops_per_sec`
//! for `sustained` is denied for `deny_for`, through the feedback
//! governor (its cap, longest TTL and shadow mode apply). What is denied
//! is the address (its network of `deny_v4_prefix`/`deny_v6_prefix` bits,
//! /32 and /128 by default, in the deny set), never the bucket: a
//! neighbour behind the same CGNAT or in the same /24 keeps its
//! allowance.
//!
//! The rate is estimated from the sampled drop events (one drop in
//! `DROP_SAMPLE`, drawn at random, reaches the ring buffer), only those of reason
//! `rate_limited`: an address already denied does not count again. Only
//! the drops of addresses that proved themselves count (see `proof.rs`):
//! a flood spoofed inside a victim's prefix is dropped as before but
//! never gets anyone denied. Memory is bounded: the samples of proven
//! addresses are kept (at most `proof::MAX_PROVEN`), of at most
//! `MAX_UNPROVEN` others a second, and of at most `MAX_KEYS` prefixes.
//!
//! Proof says an address is real, not that the drops are its: a spoofer
//! can send from a proven host's address. Drops of TCP segments of a
//! connection this host holds (the program asks the kernel's sockets for
//! each sampled one) are evidence a blind spoofer cannot forge without
//! the connection's ports: an escalation whose held drops alone are above
//! the rate is *bound*. Only a bound escalation is announced upstream,
//! and escalations that are not bound hold at most half of `max_denied`
//! (rounded up): the rest is kept for bound ones, so spoofed victims can
//! never fill the cap against the real abuser.

use std::{collections::HashMap, net::IpAddr, time::Instant};

use ipnet::IpNet;
use limiter_common::{BucketKey, DROP_SAMPLE};

use super::proof::Proven;
use crate::policy::feedback::Escalate;

/// Prefixes whose drops are counted a second (for the unproven count).
const MAX_KEYS: usize = 1_000;
/// Addresses not proven (yet) whose samples are kept a second: a spoofer
/// who fills them hides only his own drops; a proven address's samples
/// are always kept.
const MAX_UNPROVEN: usize = 1_000;
/// Most escalations asked for in one second (the rest wait a second).
const MAX_PER_SECOND: usize = 16;

/// One address's samples of a second: its bucket, how many, and when the
/// first was drained.
#[derive(Clone, Copy, Debug)]
struct Sampled {
    key: BucketKey,
    n: u64,
    /// Of them, segments of a connection this host holds.
    held: u64,
    first: Instant,
}

/// What escalation asks to deny: the network, its estimated drops a
/// second, and whether its drops are bound to a connection this host
/// holds (evidence a blind spoofer cannot forge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub net: IpNet,
    pub rate: u64,
    pub bound: bool,
}

/// How many of `max_denied` escalations may be unbound: half, rounded up.
#[must_use]
pub fn unbound_cap(max_denied: usize) -> usize {
    max_denied - max_denied / 2
}

#[derive(Debug, Default)]
pub struct Escalator {
    /// Rate-limited drop samples since the last tick, per source address.
    samples: HashMap<IpAddr, Sampled>,
    /// Of them, from addresses not proven when they were recorded.
    unproven_addrs: usize,
    /// Samples per prefix since the last tick (any source, or none known).
    prefixes: HashMap<BucketKey, u64>,
    /// Addresses that proved themselves.
    pub proven: Proven,
    /// Prefix-seconds dropped above the rate whose proven addresses were
    /// not (no one was escalated for them).
    pub unproven: u64,
    /// The last second's samples of networks above the rate whose drops
    /// were not proven at the tick (judged again at the next).
    unsure: HashMap<IpNet, HashMap<IpAddr, u64>>,
    /// Consecutive seconds above the threshold, per network.
    streaks: HashMap<IpNet, u64>,
    /// Networks escalated, with the Unix time their deny ends (not asked
    /// again before then) and whether they were bound.
    escalated: HashMap<IpNet, (u64, bool)>,
    /// Seconds above the rate each network's held drops were.
    bound_streaks: HashMap<IpNet, u64>,
    /// Escalations held back because unbound ones hold their share of
    /// `max_denied`.
    pub capped: u64,
}

impl Escalator {
    /// With proofs of the kernel's sockets read in the background.
    #[must_use]
    pub fn with_sockets() -> Self {
        Self { proven: Proven::with_sockets(), ..Self::default() }
    }

    /// Whether `net`'s escalation in force was bound (its drops were of
    /// connections this host holds; the daemon reads it from the penalty,
    /// `Found::bound`).
    #[cfg(test)]
    fn bound(&self, net: &IpNet) -> bool {
        self.escalated.get(net).is_some_and(|(_, b)| *b)
    }

    /// One sampled rate-limited drop of `key` (any class) from `src`,
    /// `held` if a segment of a connection this host holds.
    pub fn record(&mut self, key: BucketKey, src: Option<IpAddr>, held: bool) {
        let key = BucketKey { class: 0, ..key };
        if self.prefixes.len() < MAX_KEYS || self.prefixes.contains_key(&key) {
            *self.prefixes.entry(key).or_default() += 1;
        }
        let Some(src) = src else { return };
        self.proven.wanted();
        if let Some(s) = self.samples.get_mut(&src) {
            s.n += 1;
            s.held += u64::from(held);
            return;
        }
        let proven = self.proven.contains(&src);
        if !proven && self.unproven_addrs >= MAX_UNPROVEN {
            return;
        }
        self.unproven_addrs += usize::from(!proven);
        self.samples.insert(src, Sampled { key, n: 1, held: u64::from(held), first: Instant::now() });
    }

    /// Once a second, at Unix time `now`: the networks to deny now (above
    /// the rate in each of the last `sustained` whole seconds), each with
    /// its estimated drops a second and whether it is bound (its held
    /// drops alone above the rate in each of those seconds).
    pub fn second(&mut self, rule: Option<&Escalate>, now: u64) -> Vec<Found> {
        let samples = std::mem::take(&mut self.samples);
        let prefixes = std::mem::take(&mut self.prefixes);
        self.unproven_addrs = 0;
        self.proven.tick(now);
        let Some(rule) = rule else {
            self.streaks.clear();
            self.bound_streaks.clear();
            self.escalated.clear();
            self.unsure.clear();
            return Vec::new();
        };
        self.escalated.retain(|_, (until, _)| *until > now);
        let mut held: HashMap<IpNet, u64> = HashMap::new();
        let to_rate = |n: u64| n * u64::from(DROP_SAMPLE);
        let proven_rate = |p: &Proven, by: &HashMap<IpAddr, u64>| {
            to_rate(by.iter().filter(|(a, _)| p.contains(a)).map(|(_, n)| n).sum())
        };
        // The last second's networks that were above the rate but not
        // (yet) proven: judged again with the proofs read since (the
        // sockets are read when drops begin, so a proof may land just
        // after the tick).
        for (unit, by) in std::mem::take(&mut self.unsure) {
            if proven_rate(&self.proven, &by) >= rule.drops_per_sec {
                *self.streaks.entry(unit).or_default() += 1;
            }
        }
        // This second's samples by network, and the proven drops by prefix.
        let mut units: HashMap<IpNet, (HashMap<IpAddr, u64>, Instant)> = HashMap::new();
        let mut proven_of: HashMap<BucketKey, u64> = HashMap::new();
        for (addr, s) in samples {
            let unit = rule.unit(addr);
            let u = units.entry(unit).or_insert_with(|| (HashMap::new(), s.first));
            u.0.insert(addr, s.n);
            u.1 = u.1.min(s.first);
            if self.proven.contains(&addr) {
                *proven_of.entry(s.key).or_default() += s.n;
                *held.entry(unit).or_default() += s.held;
            }
        }
        // A prefix dropped above the rate whose proven addresses were not:
        // a flood no one is escalated for (spoofed, or spread thin).
        self.unproven += u64::try_from(
            prefixes
                .iter()
                .filter(|(k, n)| {
                    to_rate(**n) >= rule.drops_per_sec
                        && to_rate(proven_of.get(k).copied().unwrap_or(0)) < rule.drops_per_sec
                })
                .count(),
        )
        .unwrap_or(u64::MAX);
        let mut streaks = HashMap::new();
        let mut bound_streaks = HashMap::new();
        let mut out = Vec::new();
        for (unit, (by, first)) in units {
            let mut rate = proven_rate(&self.proven, &by);
            // The first second of a streak is partial (the drops began
            // during it): its rate is taken over the part it had drops,
            // from the first sample's drain on (at least 100 ms), so a
            // streak of `sustained` + 1 ticks ends at most `sustained` + 1 s
            // after the drops began. (The drain runs every 200 ms, so this
            // can overstate a first second's rate; the whole seconds that
            // follow must be above the rate on their own.)
            if !self.streaks.contains_key(&unit) {
                let ms = u64::try_from(first.elapsed().as_millis()).unwrap_or(u64::MAX).clamp(100, 1000);
                rate = rate.saturating_mul(1000) / ms;
            }
            if rate < rule.drops_per_sec {
                if to_rate(by.values().sum()) >= rule.drops_per_sec && self.unsure.len() < MAX_UNPROVEN {
                    if let Some(s) = self.streaks.get(&unit) {
                        streaks.insert(unit, *s);
                    }
                    self.unsure.insert(unit, by);
                }
                continue;
            }
            let streak = self.streaks.get(&unit).copied().unwrap_or(0) + 1;
            // Held drops above the rate, each second of the streak.
            let held_rate = to_rate(held.get(&unit).copied().unwrap_or(0));
            let bound_streak = if held_rate >= rule.drops_per_sec {
                self.bound_streaks.get(&unit).copied().unwrap_or(0) + 1
            } else {
                0
            };
            // The first second of a streak may be partial: a streak of
            // `sustained` + 1 seconds holds `sustained` whole ones.
            if streak > rule.sustained.as_secs() && out.len() < MAX_PER_SECOND && !self.escalated.contains_key(&unit) {
                let bound = bound_streak >= rule.sustained.as_secs();
                let unbound = self.escalated.values().filter(|(_, b)| !*b).count();
                if !bound && unbound >= unbound_cap(rule.max_denied) {
                    // Held back: the rest of the cap is kept for bound
                    // escalations. Asked again next second.
                    self.capped += 1;
                    tracing::warn!(
                        event = "escalation",
                        cidr = %unit,
                        "limiter: escalation of {unit} held back: {unbound} escalations without drops of a held connection fill their share of feedback.escalate.max_denied ({} of {})",
                        unbound_cap(rule.max_denied),
                        rule.max_denied
                    );
                } else {
                    self.escalated.insert(unit, (now + rule.deny_for.as_secs(), bound));
                    out.push(Found { net: unit, rate, bound });
                    continue;
                }
            }
            streaks.insert(unit, streak);
            if bound_streak > 0 {
                bound_streaks.insert(unit, bound_streak);
            }
        }
        self.streaks = streaks;
        self.bound_streaks = bound_streaks;
        out.sort_by_key(|f| f.net);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_common::family;

    use super::*;

    /// The /24 bucket of `addr`, of `class`.
    fn key(addr: IpAddr, class: u8) -> BucketKey {
        let IpAddr::V4(a) = addr else { unreachable!() };
        let a = u32::from(a) & 0xffff_ff00;
        BucketKey { family: family::IPV4, prefix_len: 24, class, pad: 0, addr: [a, 0] }
    }

    fn plain(found: Vec<Found>) -> Vec<(IpNet, u64)> {
        found.into_iter().map(|f| (f.net, f.rate)).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn feed_class(e: &mut Escalator, src: IpAddr, class: u8, drops: u64) {
        for _ in 0..drops / u64::from(DROP_SAMPLE) {
            e.record(key(src, class), Some(src), false);
        }
    }

    fn feed(e: &mut Escalator, src: IpAddr, drops: u64) {
        feed_class(e, src, 0, drops);
    }

    fn proven(addrs: &[IpAddr]) -> Escalator {
        let mut e = Escalator::default();
        for a in addrs {
            e.proven.prove(*a, 100);
        }
        e
    }

    fn rule() -> Escalate {
        Escalate {
            drops_per_sec: 6400,
            sustained: Duration::from_secs(3),
            deny_for: Duration::from_secs(10),
            max_denied: 100,
            deny_v4_prefix: 32,
            deny_v6_prefix: 128,
        }
    }

    #[test]
    fn only_an_address_above_the_rate_for_the_whole_time_is_escalated_once() {
        let rule = rule();
        let (flood, gap, low) = (ip("198.18.1.7"), ip("198.18.2.7"), ip("198.18.3.7"));
        let mut e = proven(&[flood, gap, low]);
        let mut seen = Vec::new();
        for now in 100..107 {
            // Split over two classes: counted as one address.
            feed_class(&mut e, flood, 0, 3200);
            feed_class(&mut e, flood, 2, 3200);
            // Above, but one quiet second breaks the streak.
            if now != 101 {
                feed(&mut e, gap, 20_000);
            }
            feed(&mut e, low, 6000);
            seen.push(plain(e.second(Some(&rule), now)));
        }
        // The first second may be partial: 3 whole seconds take 4 ticks.
        assert_eq!(seen[0..3], [vec![], vec![], vec![]]);
        assert_eq!(seen[3], vec![(net("198.18.1.7/32"), 6400)], "the fourth second above escalates");
        assert_eq!(seen[4], vec![]);
        assert_eq!(seen[5], vec![(net("198.18.2.7/32"), 19968)], "four seconds above after the gap");
        assert_eq!(seen[6], vec![], "not asked again while denied");
        // Denied until 113; an address still flooding after that is asked again.
        for now in 107..118 {
            if now >= 113 {
                feed(&mut e, flood, 6400);
            }
            seen.push(plain(e.second(Some(&rule), now)));
        }
        assert!(seen[7..16].iter().all(Vec::is_empty), "{seen:?}");
        assert_eq!(seen[16], vec![(net("198.18.1.7/32"), 6400)], "denied until 113, then four ticks above");
        // Off: nothing, and nothing kept.
        feed(&mut e, flood, 64_000);
        assert_eq!(plain(e.second(None, 200)), vec![]);
        assert!(e.streaks.is_empty() && e.escalated.is_empty());
    }

    /// A proven address flooding must not get its whole /24 denied (with
    /// `v4_prefix = 16`, the /16): its neighbour, which exceeded nothing,
    /// would get nothing through. The address is escalated alone; its neighbours in the bucket are not, however they share
    /// its drops. An operator who asks for a wider network gets the
    /// drops of its proven addresses counted together.
    #[test]
    fn an_address_is_escalated_never_its_bucket() {
        let (abuser, neighbour) = (ip("198.18.20.7"), ip("198.18.20.8"));
        let mut e = proven(&[abuser, neighbour]);
        let mut got = Vec::new();
        for now in 100..105 {
            feed(&mut e, abuser, 20_000);
            feed(&mut e, neighbour, 3200);
            got.extend(plain(e.second(Some(&rule()), now)));
        }
        assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [net("198.18.20.7/32")]);
        // Two proven addresses at half the rate each: neither alone, their
        // /28 together when the operator asks for /28s.
        let wide = Escalate { deny_v4_prefix: 28, ..rule() };
        let (a, b) = (ip("198.18.30.1"), ip("198.18.30.2"));
        for (rule, want) in [(rule(), vec![]), (wide, vec![net("198.18.30.0/28")])] {
            let mut e = proven(&[a, b]);
            let mut got = Vec::new();
            for now in 100..105 {
                feed(&mut e, a, 3200);
                feed(&mut e, b, 3200);
                got.extend(plain(e.second(Some(&rule), now)).into_iter().map(|(n, _)| n));
            }
            assert_eq!(got, want, "/{}", rule.deny_v4_prefix);
        }
    }

    #[test]
    fn memory_stays_bounded_under_spoofed_sources() {
        let real = ip("198.18.0.1");
        let mut e = proven(&[real]);
        for i in 0..100_000u32 {
            let src = IpAddr::from((0xc612_0000 + i * 256).to_be_bytes());
            e.record(key(src, 0), Some(src), false);
        }
        assert_eq!(e.prefixes.len(), MAX_KEYS);
        assert_eq!(e.samples.len(), MAX_UNPROVEN);
        // A proven address is counted however many spoofed ones came first.
        feed(&mut e, real, 6400);
        assert_eq!(e.samples[&real].n, 6400 / u64::from(DROP_SAMPLE));
    }

    /// A flood spoofed inside a prefix whose real host proved itself: only
    /// that host's share of the drops counts, far under the rate, so no
    /// one is escalated (and that is counted); the same flood from the
    /// proven host itself is.
    #[test]
    fn only_the_drops_of_proven_addresses_count() {
        let real = ip("198.18.11.7");
        let mut e = proven(&[real]);
        for now in 100..110 {
            for i in 0..12_800 / DROP_SAMPLE {
                let spoofed = IpAddr::from([198, 18, 11, u8::try_from(i % 256).unwrap()]);
                e.record(key(spoofed, 0), Some(spoofed), false);
            }
            assert_eq!(plain(e.second(Some(&rule()), now)), vec![], "at {now}");
        }
        assert_eq!(e.unproven, 10, "ten prefix-seconds above the rate, unproven");
        for now in 110..114 {
            feed(&mut e, real, 12_800);
            let got = plain(e.second(Some(&rule()), now));
            assert_eq!(got, if now == 113 { vec![(net("198.18.11.7/32"), 12_800)] } else { vec![] }, "at {now}");
        }
    }

    /// Drops of connections this host holds make an escalation bound;
    /// unbound ones hold at most half of `max_denied` (rounded up), the
    /// rest kept for bound ones: spoofed victims never fill the cap
    /// against the real abuser (E1).
    #[test]
    fn spoofed_victims_cannot_fill_the_cap_against_a_bound_abuser() {
        let victims = ["198.18.31.7", "198.18.32.7", "198.18.33.7"].map(ip);
        let abuser = ip("198.18.34.9");
        let mut e = proven(&[victims[0], victims[1], victims[2], abuser]);
        let rule = Escalate { max_denied: 3, ..rule() };
        assert_eq!([1, 2, 3, 100].map(unbound_cap), [1, 1, 2, 50]);
        let mut got = Vec::new();
        for now in 100..106 {
            for v in victims {
                feed(&mut e, v, 12_800);
            }
            for _ in 0..12_800 / u64::from(DROP_SAMPLE) {
                e.record(key(abuser, 0), Some(abuser), true);
            }
            got.extend(e.second(Some(&rule), now));
        }
        assert!(got.iter().any(|f| f.net == net("198.18.34.9/32") && f.bound), "{got:?}");
        assert_eq!(got.iter().filter(|f| !f.bound).count(), 2, "{got:?}");
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(e.capped >= 1);
        assert!(e.bound(&net("198.18.34.9/32")));
        assert!(victims.iter().all(|v| !e.bound(&IpNet::from(*v))));
    }
}
