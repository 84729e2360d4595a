//! Client-side adaptive throttling toward the tenant layer (the SRE
//! book's formula): over a trailing window, `requests` are the
//! connections the forwarder handed to the tenant layer or refused here,
//! and `accepts` those the tenant layer answered (the first byte came
//! back; reset, timed out or closed before answering are not). A connect
//! that fails is the passive health check's, not counted here: the
//! backend goes out of service and is probed back, and a remembered
//! outage would slow the recovery after it for a whole window. A connection counts once its outcome is known (its
//! first byte back, or its end without one): one still waiting for its
//! answer counts as neither, so a burst of new connections, or a slow
//! first byte, is not taken for refusals. A new connection is refused here with
//! probability `max(0, (requests - K * accepts) / (requests + 1))`, so
//! the attempts that reach an overloaded tenant layer fall to about K
//! times what it accepts, and the throttling ends by itself as its
//! accepts come back. The tenant layer may also say it is overloaded
//! (`POST /v1/load` on the feedback endpoint): each rejection it reports
//! counts as a request not accepted.

use crate::policy::Criticality;
use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Requests and accepts of one second of the window, and of those
/// requests, the connections resolved here and the rejections the tenant
/// layer reported.
#[derive(Clone, Copy, Default)]
struct Second {
    at: u64,
    requests: u64,
    accepts: u64,
    resolved: u64,
    reported: u64,
}

struct Window {
    seconds: Vec<Second>,
    total: Second,
}

/// One forwarder's throttle.
pub struct Adaptive {
    k: f64,
    start: Instant,
    window: Mutex<Window>,
    rng: AtomicU64,
}

impl Adaptive {
    /// `k` at least 1; `window` rounded to whole seconds (at least 1).
    #[must_use]
    pub fn new(k: f64, window: Duration) -> Self {
        let n = usize::try_from(window.as_secs().max(1)).unwrap_or(usize::MAX).min(3600);
        let nanos = crate::clock::since_epoch().subsec_nanos();
        let seed = u64::from(std::process::id()) << 32 ^ u64::from(nanos) ^ 0x9e37_79b9_7f4a_7c15;
        Self {
            k,
            start: Instant::now(),
            window: Mutex::new(Window { seconds: vec![Second::default(); n], total: Second::default() }),
            rng: AtomicU64::new(seed | 1),
        }
    }

    /// Add `d` to this second, after dropping the seconds that left the
    /// window; returns the window's totals and how many of `d`'s reported
    /// rejections counted.
    fn add(&self, d: Second) -> (Second, u64) {
        let now = self.start.elapsed().as_secs() + 1;
        let mut window = self.window.lock().expect("not poisoned");
        let Window { seconds, total } = &mut *window;
        let len = seconds.len() as u64;
        let slot = usize::try_from(now % len).unwrap_or(0);
        if seconds[slot].at != now {
            // Seconds that left the window (this slot's earlier round, and
            // any skipped while idle).
            for old in seconds.iter_mut().filter(|o| o.at != 0 && o.at + len <= now) {
                total.requests -= old.requests;
                total.accepts -= old.accepts;
                total.resolved -= old.resolved;
                total.reported -= old.reported;
                *old = Second::default();
            }
            seconds[slot] = Second { at: now, ..Second::default() };
        }
        // What the tenant layer reports is bounded by the connections
        // resolved here in the window: one report (`rejected = 1000000`
        // set the probability to 0.9998) can at most double the requests.
        let reported = d.reported.min(total.resolved.saturating_sub(total.reported));
        let d = Second { requests: d.requests - (d.reported - reported), reported, ..d };
        let s = &mut seconds[slot];
        (s.requests, s.accepts, s.resolved, s.reported) =
            (s.requests + d.requests, s.accepts + d.accepts, s.resolved + d.resolved, s.reported + d.reported);
        (total.requests, total.accepts, total.resolved, total.reported) = (
            total.requests + d.requests,
            total.accepts + d.accepts,
            total.resolved + d.resolved,
            total.reported + d.reported,
        );
        (*total, reported)
    }

    /// The refusal probability for totals `(requests, accepts)`.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    pub fn probability_of(&self, requests: u64, accepts: u64) -> f64 {
        let (r, a) = (requests as f64, accepts as f64);
        ((r - self.k * a) / (r + 1.0)).max(0.0)
    }

    /// A new connection of criticality `c`: whether to refuse it here
    /// (then counted as a request not accepted). A sheddable one is
    /// refused at twice the probability; a critical one (an operator's
    /// `allow` is critical) never: automation does not shed what the
    /// operator vouched for.
    pub fn refuse(&self, c: Criticality) -> bool {
        let (t, _) = self.add(Second::default());
        let p = self.probability_of(t.requests, t.accepts);
        let p = match c {
            Criticality::Sheddable => (2.0 * p).min(1.0),
            Criticality::Default => p,
            Criticality::Critical => 0.0,
        };
        let refused = p > 0.0 && self.uniform() < p;
        if refused {
            self.add(Second { requests: 1, ..Second::default() });
        }
        refused
    }

    /// A connection sent backend has its outcome: answered, or ended by
    /// the tenant layer (or idle) without a byte back.
    pub fn resolved(&self, accepted: bool) {
        self.add(Second { requests: 1, accepts: u64::from(accepted), resolved: 1, ..Second::default() });
    }

    /// The tenant layer said it rejected `n` requests (`POST /v1/load`):
    /// counted up to the connections resolved in the window not yet
    /// matched by a report. Returns how many were counted.
    pub fn rejected(&self, n: u64) -> u64 {
        self.add(Second { requests: n, reported: n, ..Second::default() }).1
    }

    /// The window's requests, accepts and refusal probability now.
    #[must_use]
    pub fn state(&self) -> (u64, u64, f64) {
        let (t, _) = self.add(Second::default());
        (t.requests, t.accepts, self.probability_of(t.requests, t.accepts))
    }

    /// A uniform number in [0, 1) (xorshift64*; not for secrets: the
    /// sheds only need to be spread).
    fn uniform(&self) -> f64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        // The top 32 bits: spread enough for a shed's draw.
        f64::from(u32::try_from(x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32).unwrap_or(0)) / 4_294_967_296.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formula_refuses_nothing_while_accepts_keep_up() {
        let a = Adaptive::new(2.0, Duration::from_mins(2));
        assert!(a.probability_of(100, 50).abs() < f64::EPSILON, "K x accepts = requests: nothing refused");
        assert!((a.probability_of(100, 0) - 100.0 / 101.0).abs() < 1e-9);
        assert!((a.probability_of(100, 30) - 40.0 / 101.0).abs() < 1e-9);
        for _ in 0..100 {
            assert!(!a.refuse(Criticality::Default));
            a.resolved(true);
        }
        let (r, acc, p) = a.state();
        assert_eq!((r, acc), (100, 100));
        assert!(p.abs() < f64::EPSILON);
    }

    #[test]
    fn refusals_follow_the_probability() {
        let a = Adaptive::new(2.0, Duration::from_mins(2));
        // 1,000 requests, 100 accepts: p = (1000 - 200) / 1001 ~ 0.8.
        a.add(Second { requests: 1000, accepts: 100, ..Second::default() });
        let refused = (0..10_000).filter(|_| a.refuse(Criticality::Default)).count();
        // Each refusal adds a request, so p climbs a little on the way.
        assert!((7_800..9_600).contains(&refused), "{refused}");
        // By criticality: twice the probability for sheddable, none for
        // critical (p ~ 0.4 here).
        let share = |k| {
            let c = Adaptive::new(2.0, Duration::from_mins(2));
            c.add(Second { requests: 1_000_000, accepts: 300_000, ..Second::default() });
            (0..4000).filter(|_| c.refuse(k)).count()
        };
        let (shed, def, crit) =
            (share(Criticality::Sheddable), share(Criticality::Default), share(Criticality::Critical));
        // Expected 3,200, 1,600 and 0 of 4,000.
        assert!((2900..3500).contains(&shed), "sheddable {shed}");
        assert!((1400..1800).contains(&def), "default {def}");
        assert_eq!(crit, 0, "critical");
        // Connections still waiting for their answer count as nothing.
        let b = Adaptive::new(2.0, Duration::from_mins(2));
        assert!((0..1000).all(|_| !b.refuse(Criticality::Sheddable)), "nothing resolved, nothing refused");
    }

    #[test]
    fn a_report_counts_no_more_than_the_connections_resolved_in_the_window() {
        let a = Adaptive::new(2.0, Duration::from_mins(2));
        assert_eq!(a.rejected(1_000_000), 0, "nothing resolved: nothing to reject");
        for _ in 0..100 {
            a.resolved(true);
        }
        assert_eq!(a.rejected(1_000_000), 100);
        assert_eq!(a.rejected(5), 0, "the window's connections are matched already");
        // 200 requests, 100 accepts: K = 2 refuses nothing.
        let (r, acc, p) = a.state();
        assert_eq!((r, acc), (200, 100));
        assert!(p.abs() < f64::EPSILON, "{p}");
        assert!((0..1000).all(|_| !a.refuse(Criticality::Default)));
    }
}
