//! Admission arithmetic: GCRA, the "virtual scheduling" form of a token
//! bucket, on one `u64` so a bucket updates with a single compare-and-swap.
//!
//! A bucket of depth `burst` units refilled at `rate` units/s is tracked by
//! its theoretical arrival time `tat`. A packet of cost `c` arriving at `now`
//! is admitted iff `max(tat, now) + c * unit - now <= tau`, and then
//! `tat := max(tat, now) + c * unit`. Refused packets leave `tat` unchanged,
//! so a flood never drives a bucket into debt.
//!
//! Time is fixed point: 1/16 ns ([`TIME_SHIFT`] = 4 fraction bits), so a
//! `u64` covers 36 years of `CLOCK_MONOTONIC` and byte rates up to 1 GB/s
//! still get a precise per-byte interval. With
//! - `unit = ceil(16e9 / rate)` (one unit's interval, rounded up) and
//! - `tau = burst * unit` (exactly `burst` units fit at one instant),
//!
//! invariant 1 holds exactly: over any window `W`, admitted cost
//! `<= burst + rate * W` (see `tests::admitted_never_exceeds_bound`), since
//! `sum(c) * unit <= W + tau` and `unit >= 16e9 / rate`.
//!
//! The effective refill rate is `16e9 / unit`: equal to `rate` when `rate`
//! divides 16e9 (every 2^a * 5^b up to 1.6e10, e.g. 10, 600, 1000, 1e6,
//! 125e6), and otherwise below it by less than `1 / unit` relative (under
//! 0.01% for any rate up to 1e6/s). A sequence conforming to the effective
//! rate and `burst` is never refused (`tests::conforming_sequence_*`).
//!
//! Time only moves forward: `max(tat, now)` means a clock that steps back
//! makes admission stricter, never looser (invariant 4).

/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;
/// Fraction bits of the data plane's time unit (1/16 ns).
pub const TIME_SHIFT: u32 = 4;
/// Largest accepted rate (units/s): one unit per 1/16 ns.
pub const MAX_RATE: u64 = NS_PER_S << TIME_SHIFT;

/// Nanoseconds to the fixed-point time unit.
#[inline(always)]
#[must_use]
pub const fn to_fixed(ns: u64) -> u64 {
    ns << TIME_SHIFT
}

/// Interval of one unit at `rate` units/s, in 1/16 ns, rounded up.
/// `rate` must be in `1..=MAX_RATE`.
#[inline(always)]
#[must_use]
pub const fn unit_interval(rate: u64) -> u64 {
    (NS_PER_S << TIME_SHIFT).div_ceil(rate)
}

/// Burst tolerance in 1/16 ns, or `None` if it does not fit a `u64` with
/// a century of headroom for `now`.
#[inline(always)]
#[must_use]
pub const fn tau(burst: u64, unit: u64) -> Option<u64> {
    match burst.checked_mul(unit) {
        Some(t) if t <= u64::MAX >> 2 => Some(t),
        _ => None,
    }
}

/// The GCRA step: `Some(new_tat)` if a packet charging `inc` is admitted at
/// `now` (all in 1/16 ns), `None` if refused (the bucket keeps its `tat`).
#[inline(always)]
#[must_use]
pub const fn admit(tat: u64, now: u64, inc: u64, tau: u64) -> Option<u64> {
    let base = if tat > now { tat } else { now };
    let new_tat = base.saturating_add(inc);
    // new_tat >= now always, so this subtraction cannot wrap.
    if new_tat - now <= tau { Some(new_tat) } else { None }
}

/// Initial `tat` of a bucket created at `now`: a full bucket.
#[inline(always)]
#[must_use]
pub const fn fresh_tat(now: u64) -> u64 {
    now
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    /// Run a sequence of `(time_ns, cost)` arrivals through one bucket.
    fn run(rate: u64, burst: u64, arrivals: &[(u64, u64)]) -> Vec<bool> {
        let unit = unit_interval(rate);
        let tau = tau(burst, unit).unwrap();
        let mut tat = None;
        arrivals
            .iter()
            .map(|&(t, c)| {
                let now = to_fixed(t);
                let cur = tat.unwrap_or(fresh_tat(now));
                let next = admit(cur, now, c * unit, tau);
                tat = Some(next.unwrap_or(cur));
                next.is_some()
            })
            .collect()
    }

    /// Token-bucket conformance written independently of the GCRA code:
    /// tokens are counted in units of `1 / (rate_num)` so the refill of a
    /// bucket whose rate is `rate_num / rate_den` units/ns is integral.
    fn conforms(rate_num: u128, rate_den: u128, burst: u64, arrivals: &[(u64, u64)]) -> bool {
        // tokens * rate_den = units * rate_den; refill per ns = rate_num.
        let cap = u128::from(burst) * rate_den;
        let mut tokens = cap;
        let mut last = arrivals.first().map_or(0, |a| a.0);
        for &(t, c) in arrivals {
            tokens = (tokens + u128::from(t - last) * rate_num).min(cap);
            last = t;
            let need = u128::from(c) * rate_den;
            if tokens < need {
                return false;
            }
            tokens -= need;
        }
        true
    }

    /// Keep the arrivals of `seq` that a conforming sender could have sent.
    fn thin(seq: Vec<(u64, u64)>, ok: impl Fn(&[(u64, u64)]) -> bool) -> Vec<(u64, u64)> {
        let mut kept = Vec::new();
        for a in seq {
            kept.push(a);
            if !ok(&kept) {
                kept.pop();
            }
        }
        kept
    }

    /// Largest admitted cost in any window `[t, t + w)`, by brute force.
    fn max_window_cost(arrivals: &[(u64, u64)], admitted: &[bool], w: u64) -> u64 {
        let acc: Vec<(u64, u64)> = arrivals.iter().zip(admitted).filter(|(_, a)| **a).map(|(x, _)| *x).collect();
        let mut best = 0;
        for (i, &(ti, _)) in acc.iter().enumerate() {
            let s: u64 = acc[i..].iter().take_while(|(t, _)| *t < ti + w).map(|(_, c)| c).sum();
            best = best.max(s);
        }
        best
    }

    /// Sorted arrival times with random gaps and weights.
    fn arrivals(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0..max_gap, 1..=max_cost), 1..300).prop_map(|v| {
            let mut t = 1_000_000_000u64;
            v.into_iter()
                .map(|(gap, c)| {
                    t += gap;
                    (t, c)
                })
                .collect()
        })
    }

    /// Rates that divide 1e9 (exact arithmetic).
    fn exact_rate() -> impl Strategy<Value = u64> {
        (0u32..=9, 0u32..=9).prop_map(|(a, b)| 2u64.pow(a) * 5u64.pow(b))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn admitted_never_exceeds_bound(
            rate in 1u64..100_000,
            burst in 1u64..200,
            seq in arrivals(20_000_000, 8),
            window_ms in 1u64..5_000,
        ) {
            let adm = run(rate, burst, &seq);
            let w = window_ms * 1_000_000;
            let got = max_window_cost(&seq, &adm, w);
            // burst + rate * W, rounded up to whole units of cost.
            let bound = burst + (rate * w).div_ceil(NS_PER_S);
            prop_assert!(got <= bound, "admitted {got} > bound {bound}");
        }

        #[test]
        fn conforming_sequence_is_never_refused_at_exact_rates(
            rate in exact_rate(),
            burst in 1u64..200,
            seq in arrivals(20_000_000, 8),
        ) {
            // Declared rate in units/ns is rate / 1e9.
            let kept = thin(seq, |k| conforms(u128::from(rate), u128::from(NS_PER_S), burst, k));
            let adm = run(rate, burst, &kept);
            prop_assert!(adm.iter().all(|a| *a), "conforming arrival refused: {kept:?}");
        }

        #[test]
        fn conforming_sequence_is_never_refused_at_effective_rates(
            rate in 1u64..2_000_000,
            burst in 1u64..50,
            seq in arrivals(2_000_000, 4),
        ) {
            // Effective rate in units/ns is 16 / unit.
            let unit = u128::from(unit_interval(rate));
            let kept = thin(seq, |k| conforms(1 << TIME_SHIFT, unit, burst, k));
            let adm = run(rate, burst, &kept);
            prop_assert!(adm.iter().all(|a| *a));
            // And the effective rate 16e9/unit is within 1/unit of the declared
            // one: rate * (unit - 1) < 16e9 <= rate * unit.
            let (r, u, scale) = (u128::from(rate), unit, u128::from(NS_PER_S) << TIME_SHIFT);
            prop_assert!(r * (u - 1) < scale && scale <= r * u);
        }

        #[test]
        fn clock_stepping_back_mints_no_credit(
            tat in 0u64..1u64 << 50,
            now in 0u64..1u64 << 50,
            back in 0u64..1u64 << 40,
            inc in 1u64..1_000_000,
            tau in 0u64..10_000_000,
        ) {
            // The same bucket seen at an earlier instant never admits what it
            // would refuse at the later one, and never ends up further back.
            let later = admit(tat, now, inc, tau);
            let earlier = admit(tat, now.saturating_sub(back), inc, tau);
            if later.is_none() {
                prop_assert!(earlier.is_none());
            }
            if let (Some(a), Some(b)) = (later, earlier) {
                prop_assert!(b >= tat && a >= tat);
            }
        }
    }

    #[test]
    fn full_bucket_admits_exactly_burst_at_one_instant() {
        for (rate, burst) in [(10, 60), (1000, 1), (3, 7), (999_999, 1000), (7, 1_000_000)] {
            let seq: Vec<(u64, u64)> = (0..burst + 5).map(|_| (5_000, 1)).collect();
            let adm = run(rate, burst, &seq);
            assert_eq!(adm.iter().filter(|a| **a).count() as u64, burst, "{rate}/{burst}");
        }
    }

    #[test]
    fn rounding_directions() {
        assert_eq!(unit_interval(3), 5_333_333_334);
        assert_eq!(unit_interval(10), 1_600_000_000);
        assert_eq!(unit_interval(125_000_000), 128);
        assert_eq!(tau(u64::MAX, 2), None);
    }
}
