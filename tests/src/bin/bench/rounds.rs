//! Bench `forward`'s rounds: the forwarders' rows are measured in several
//! interleaved rounds (the machine's speed drifts by 5-10% over tens of
//! seconds, and a row can catch a slow spell of a few seconds), each
//! round a workload at a time (that workload's rows seconds apart), the
//! forwarders in an order that turns by one each round so none always
//! follows the same one. A figure is the median of a forwarder's rounds;
//! a goal is judged on the median of the rounds' ratios, so a slow spell
//! in a few rounds moves neither.

/// Rounds of each forwarder's rows.
pub const ROUNDS: usize = 7;

/// The median of `v` (the mean of the middle two when even); NaN when empty.
#[must_use]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// One figure of a row.
pub type Fig<T> = fn(&T) -> f64;

/// The median over `rounds` of `fig(round)`.
pub fn median_of<R>(rounds: &[R], fig: impl Fn(&R) -> f64) -> f64 {
    median(rounds.iter().map(fig).collect())
}

/// The order of `n` rows in round `round`: each round starts one later.
pub fn order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

/// `f`'s result, and each CPU's busy share while it ran.
pub fn busy_during<T>(f: impl FnOnce() -> T) -> (T, [f64; 2]) {
    let (start, ticks) = (std::time::Instant::now(), super::system::busy_ticks());
    let out = f();
    let (secs, after) = (start.elapsed().as_secs_f64(), super::system::busy_ticks());
    // /proc/stat counts in USER_HZ, 100 a second.
    (out, [0, 1].map(|c| (after[c] - ticks[c]) as f64 / (secs * 100.0)))
}

/// A CPU at least this busy bounded the row it ran.
pub const SATURATED: f64 = 0.95;

/// A goal's verdict: "met" or "NOT met"; but none when no forwarder's
/// CPU was the bound and the other CPU was (`fronts`: each compared
/// forwarder's CPU busy share, `others`: the other CPU's in the same
/// rows, medians of their rounds): the load generator and the upstream
/// then bounded every forwarder alike, and the ratio between them is the
/// machine's noise (measured: 30% from round to round in such a row).
#[must_use]
pub fn verdict(ok: bool, fronts: &[f64], others: &[f64], other_cpu: usize) -> String {
    let most = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    if most(fronts) < SATURATED && most(others) >= SATURATED {
        let least = fronts.iter().copied().fold(1.0, f64::min);
        return format!(
            "no verdict: CPU {other_cpu} (the client and upstream) was the bound, {:.0}% busy, and no forwarder's ({:.0}-{:.0}%)",
            most(others) * 100.0,
            least * 100.0,
            most(fronts) * 100.0
        );
    }
    (if ok { "met" } else { "NOT met" }).into()
}

#[cfg(test)]
mod tests {
    use super::{median, order, verdict};

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert!((median(vec![5.0, 1.0, 3.0]) - 3.0).abs() < 1e-12);
        assert!((median(vec![4.0, 1.0, 3.0, 2.0]) - 2.5).abs() < 1e-12);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn a_row_no_forwarder_bounded_gets_no_verdict() {
        assert_eq!(verdict(true, &[0.99, 0.90], &[0.97, 1.0], 1), "met");
        assert_eq!(verdict(false, &[0.99, 0.90], &[0.97, 1.0], 1), "NOT met");
        assert!(verdict(false, &[0.91, 0.83], &[1.0, 1.0], 1).starts_with("no verdict: CPU 1"));
        // Neither CPU saturated: latency bounded the row; it is judged.
        assert_eq!(verdict(false, &[0.80], &[0.70], 1), "NOT met");
    }

    #[test]
    fn each_round_starts_with_the_next_row_and_measures_every_row_once() {
        let rounds: Vec<Vec<usize>> = (0..3).map(|r| order(3, r).collect()).collect();
        assert_eq!(rounds, [[0, 1, 2], [1, 2, 0], [2, 0, 1]]);
    }
}
