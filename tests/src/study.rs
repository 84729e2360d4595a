//! The case study's model of delayed synchronization
//! (`rate-limit/distributed.mjs` in seed 004), to run beside the real
//! fleet on the same requests: each node admits while the shared view
//! taken at the last sync plus its own count since then is under the
//! limit, and a sync sets the view to the fleet's exact total, taking no
//! time.

use crate::fleet::Lcg;

/// The study's seed for its generator.
pub const SEED: u32 = 20_260_730;

/// The node (of `n`) of each of the study's first `count` requests: its
/// generator and seed, drawn request after request.
#[must_use]
pub fn nodes(count: usize, n: usize) -> Vec<usize> {
    let mut rng = Lcg::new(SEED);
    (0..count).map(|_| rng.below(n)).collect()
}

/// The study's requests at `rate` a second (request `i` at `i / rate` s,
/// in ns) on `nodes`.
#[must_use]
pub fn requests(rate: u32, nodes: &[usize]) -> Vec<(u64, usize)> {
    (0u64..).zip(nodes).map(|(i, &k)| (i * 1_000_000_000 / u64::from(rate), k)).collect()
}

/// The study's split quota: each of `n` nodes admits `limit / n` of the
/// requests on `nodes`. How many are refused.
#[must_use]
pub fn split_quota(nodes: &[usize], n: usize, limit: u64) -> u64 {
    let (mut local, mut refused) = (vec![0u64; n], 0);
    for &k in nodes {
        if local[k] < limit / n as u64 {
            local[k] += 1;
        } else {
            refused += 1;
        }
    }
    refused
}

/// The study's code as written: request `i` at `i / rate` seconds on node
/// `nodes[i]` (of `n`); a sync at the first request at least `interval`
/// seconds after the last sync, compared in `f64` as the study does (so
/// its 0.2 s sync falls on the 19th request after the last one every
/// other time: a sync every 0.211 s on average). How many are admitted.
#[must_use]
pub fn as_written(rate: u32, interval: f64, nodes: &[usize], n: usize, limit: u64) -> u64 {
    let mut local = vec![0u64; n];
    let (mut global, mut view, mut last, mut accepted) = (0u64, 0u64, 0.0f64, 0u64);
    for (i, &node) in nodes.iter().enumerate() {
        let t = f64::from(u32::try_from(i).unwrap_or(u32::MAX)) / f64::from(rate);
        if t - last >= interval {
            (view, last) = (global, t);
            local.fill(0);
        }
        if view + local[node] < limit {
            (accepted, global, local[node]) = (accepted + 1, global + 1, local[node] + 1);
        }
    }
    accepted
}

/// The same model with a sync on every multiple of `interval_ns` of the
/// clock, as the daemons sync (one falling on a request's instant goes
/// first): `requests` are (time ns, node of `n`) in time order. How many
/// are admitted.
#[must_use]
pub fn on_ticks(requests: &[(u64, usize)], n: usize, limit: u64, interval_ns: u64) -> u64 {
    let mut local = vec![0u64; n];
    let (mut global, mut view, mut tick, mut accepted) = (0u64, 0u64, None, 0u64);
    for &(t, node) in requests {
        let k = t / interval_ns;
        if tick != Some(k) {
            (view, tick) = (global, Some(k));
            local.fill(0);
        }
        if view + local[node] < limit {
            (accepted, global, local[node]) = (accepted + 1, global + 1, local[node] + 1);
        }
    }
    accepted
}

/// The study's three arrival patterns of one client, in ms from the
/// start, with the admitted counts of its sliding-window row (600 per
/// 60 s in 12 slices): uniform at 2x the rate (3,600 over 3 minutes),
/// piled at the boundary (600 in the last 5 s before a minute and 600 in
/// the first 5 s after, twice), spaced at the limit (600 in the first 5 s
/// of each minute).
#[must_use]
pub fn patterns() -> [(&'static str, Vec<u64>, u64); 3] {
    let uniform: Vec<u64> = (0..3600).map(|i| i * 50).collect();
    let mut piled: Vec<u64> = [60_000u64, 120_000]
        .iter()
        .flat_map(|b| {
            [(b - 5_000, 600u64), (*b, 600)].into_iter().flat_map(|(s, n)| (0..n).map(move |i| s + i * 5_000 / n))
        })
        .collect();
    piled.sort_unstable();
    let spaced: Vec<u64> = (0..3).flat_map(|k| (0..600u64).map(move |i| k * 60_000 + i * 5_000 / 600)).collect();
    [
        ("uniform at 2x the rate", uniform, 1800),
        ("piled at the boundary", piled, 1200),
        ("spaced at the limit", spaced, 1800),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transcription gives the study's published table (its
    /// generator, seed, 8 nodes, 600 per 60 s).
    #[test]
    fn as_written_gives_the_studys_table() {
        let at_90: Vec<u64> =
            [0.2, 1.0, 2.0, 5.0].iter().map(|&i| as_written(90, i, &nodes(90 * 60, 8), 8, 600)).collect();
        assert_eq!(at_90, [609, 630, 720, 900]);
        assert_eq!(as_written(10, 0.2, &nodes(10 * 60, 8), 8, 600), 600);
    }

    /// Its split quota refuses 25 of a client exactly at the limit.
    #[test]
    fn split_quota_gives_the_studys_figure() {
        assert_eq!(split_quota(&nodes(10 * 60, 8), 8, 600), 25);
    }

    /// Where the study's `f64` test does not drift (whole seconds), its
    /// syncs fall on the ticks and both give the same.
    #[test]
    fn on_ticks_is_the_study_where_its_syncs_fall_on_the_ticks() {
        let n = nodes(90 * 60, 8);
        let requests = requests(90, &n);
        for s in [1u32, 2, 5] {
            assert_eq!(
                on_ticks(&requests, 8, 600, u64::from(s) * 1_000_000_000),
                as_written(90, f64::from(s), &n, 8, 600)
            );
        }
        // At 0.2 s the study's syncs drift off the ticks, and the two differ.
        assert_ne!(on_ticks(&requests, 8, 600, 200_000_000), as_written(90, 0.2, &n, 8, 600));
    }
}
