//! The policy's top-level settings, declared once: the policy file's
//! top-level keys (flattened into the file's model) and `limiter run`'s
//! flags (flattened into its arguments) are this one struct, and
//! [`Knobs::apply`] is the one place that lays them over a policy: the
//! file's over the built-in policy, the flags' over the file's.

use serde::{Deserialize, Serialize};

use super::{Aggregate, CostUnit, DEFAULT_AGGREGATE_PREFIXES, Policy, PolicyError, bad};

/// The default class's limit, the bucket prefixes, the bucket map's
/// capacity, the new-source budget and the aggregate tier. `None` = not
/// given (the policy beneath keeps its value; defaults are
/// [`Policy::default`]'s).
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(default)]
pub struct Knobs {
    /// Units (packets or bytes) per second per prefix [default: 1000].
    #[arg(long, value_name = "N")]
    pub rate: Option<u64>,
    /// Bucket depth in units [default: 2000].
    #[arg(long, value_name = "N")]
    pub burst: Option<u64>,
    /// What a packet costs [default: packets].
    #[arg(long, value_enum)]
    pub cost: Option<CostUnit>,
    /// IPv4 source prefix length [default: 24].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=32))]
    pub v4_prefix: Option<u32>,
    /// IPv6 source prefix length, at most 64 [default: 56].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64))]
    pub v6_prefix: Option<u32>,
    /// Tracked prefixes (LRU capacity) [default: 262144].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub capacity: Option<u32>,
    /// New prefixes admitted per second, shared by all sources (with
    /// --new-source-burst; 0 = unlimited) [default: 5000, burst 10000].
    #[arg(long, value_name = "N")]
    pub new_source_rate: Option<u64>,
    /// Depth of the new-source budget.
    #[arg(long, value_name = "N", requires = "new_source_rate")]
    pub new_source_burst: Option<u64>,
    /// Aggregate tier: units per second per coarser prefix, charged with
    /// the fine one (with --aggregate-burst) [default: off].
    #[arg(long, value_name = "N", requires = "aggregate_burst")]
    pub aggregate_rate: Option<u64>,
    /// Depth of each aggregate bucket.
    #[arg(long, value_name = "N", requires = "aggregate_rate")]
    pub aggregate_burst: Option<u64>,
    /// Aggregate IPv4 prefix length [default: 16].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=32))]
    pub aggregate_v4_prefix: Option<u32>,
    /// Aggregate IPv6 prefix length [default: 40].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64))]
    pub aggregate_v6_prefix: Option<u32>,
}

/// Why knobs were refused: the error (its field the one at fault, which
/// may be missing) and the key given that shows it, to locate it by.
pub type KnobError = (PolicyError, &'static str);

impl Knobs {
    /// `p` with the given knobs laid over it. A pair is given whole (a
    /// rate of 0 turns the new-source budget off, its burst moot), and
    /// the aggregate prefixes need the tier on, here or beneath.
    pub fn apply(&self, mut p: Policy) -> Result<Policy, KnobError> {
        let d = &mut p.default;
        d.rate = self.rate.unwrap_or(d.rate);
        d.burst = self.burst.unwrap_or(d.burst);
        d.cost = self.cost.unwrap_or(d.cost);
        p.v4_prefix = self.v4_prefix.unwrap_or(p.v4_prefix);
        p.v6_prefix = self.v6_prefix.unwrap_or(p.v6_prefix);
        p.capacity = self.capacity.unwrap_or(p.capacity);
        let needs =
            |given: &'static str, missing: &'static str| (bad(missing, format!("{given} needs {missing}")), given);
        match (self.new_source_rate, self.new_source_burst) {
            (Some(0), _) => p.new_sources = None,
            (Some(r), Some(b)) => p.new_sources = Some((r, b)),
            (Some(_), None) => return Err(needs("new_source_rate", "new_source_burst")),
            (None, Some(_)) => return Err(needs("new_source_burst", "new_source_rate")),
            (None, None) => {}
        }
        match (self.aggregate_rate, self.aggregate_burst) {
            (Some(rate), Some(burst)) => {
                let (v4_prefix, v6_prefix) = DEFAULT_AGGREGATE_PREFIXES;
                p.aggregate = Some(Aggregate { rate, burst, v4_prefix, v6_prefix });
            }
            (Some(_), None) => return Err(needs("aggregate_rate", "aggregate_burst")),
            (None, Some(_)) => return Err(needs("aggregate_burst", "aggregate_rate")),
            (None, None) => {}
        }
        match p.aggregate.as_mut() {
            Some(a) => {
                a.v4_prefix = self.aggregate_v4_prefix.unwrap_or(a.v4_prefix);
                a.v6_prefix = self.aggregate_v6_prefix.unwrap_or(a.v6_prefix);
            }
            None if self.aggregate_v4_prefix.is_some() || self.aggregate_v6_prefix.is_some() => {
                let given =
                    if self.aggregate_v4_prefix.is_some() { "aggregate_v4_prefix" } else { "aggregate_v6_prefix" };
                let problem = "aggregate prefixes need aggregate_rate and aggregate_burst";
                return Err((bad("aggregate_rate", problem), given));
            }
            None => {}
        }
        Ok(p)
    }

    /// The knobs that give `p`'s values, every one (a policy as a file
    /// renders it).
    #[must_use]
    pub fn of(p: &Policy) -> Self {
        let (new_source_rate, new_source_burst) = match p.new_sources {
            Some((rate, burst)) => (Some(rate), Some(burst)),
            // 0 turns the budget off.
            None => (Some(0), None),
        };
        let a = p.aggregate;
        Knobs {
            rate: Some(p.default.rate),
            burst: Some(p.default.burst),
            cost: Some(p.default.cost),
            v4_prefix: Some(p.v4_prefix),
            v6_prefix: Some(p.v6_prefix),
            capacity: Some(p.capacity),
            new_source_rate,
            new_source_burst,
            aggregate_rate: a.map(|a| a.rate),
            aggregate_burst: a.map(|a| a.burst),
            aggregate_v4_prefix: a.map(|a| a.v4_prefix),
            aggregate_v6_prefix: a.map(|a| a.v6_prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Laid over the policy beneath, each knob replaces its value; what
    /// is not given is kept; a pair given half is refused, naming the half
    /// that is missing and the key given.
    #[test]
    fn given_knobs_replace_what_is_beneath_and_half_a_pair_is_refused() {
        let beneath = Policy { v6_prefix: 48, ..Policy::default() };
        let k = Knobs {
            rate: Some(7),
            new_source_rate: Some(0),
            aggregate_rate: Some(9),
            aggregate_burst: Some(18),
            aggregate_v6_prefix: Some(44),
            ..Knobs::default()
        };
        let p = k.apply(beneath.clone()).unwrap();
        assert_eq!((p.default.rate, p.default.burst, p.v6_prefix), (7, beneath.default.burst, 48));
        assert_eq!(p.new_sources, None);
        assert_eq!(p.aggregate, Some(Aggregate { rate: 9, burst: 18, v4_prefix: 16, v6_prefix: 44 }));
        assert_eq!(Knobs::default().apply(beneath.clone()).unwrap(), beneath);
        // The tier on beneath: its prefixes alone are taken.
        let on = Knobs { aggregate_v4_prefix: Some(20), ..Knobs::default() }.apply(p).unwrap();
        assert_eq!(on.aggregate.map(|a| (a.rate, a.v4_prefix)), Some((9, 20)));
        let half = |k: Knobs| k.apply(beneath.clone()).map(drop).unwrap_err();
        let (e, at) = half(Knobs { new_source_rate: Some(5), ..Knobs::default() });
        assert_eq!((e.field.as_str(), at), ("new_source_burst", "new_source_rate"));
        let (e, at) = half(Knobs { aggregate_burst: Some(5), ..Knobs::default() });
        assert_eq!((e.field.as_str(), at), ("aggregate_rate", "aggregate_burst"));
        let (e, at) = half(Knobs { aggregate_v6_prefix: Some(40), ..Knobs::default() });
        assert_eq!((e.field.as_str(), at), ("aggregate_rate", "aggregate_v6_prefix"));
    }

    /// A policy's knobs, laid over the built-in policy, give it back.
    #[test]
    fn the_knobs_of_a_policy_give_it_back() {
        let aggregate = Some(Aggregate { rate: 3, burst: 6, v4_prefix: 18, v6_prefix: 42 });
        for p in [
            Policy::default(),
            Policy { new_sources: None, aggregate, v4_prefix: 20, capacity: 4096, ..Policy::default() },
        ] {
            assert_eq!(Knobs::of(&p).apply(Policy::default()).unwrap(), p);
        }
    }
}
