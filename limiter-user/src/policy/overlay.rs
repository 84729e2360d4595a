//! Command-line flags laid over the policy file: each flag given replaces
//! the file's value; flags not given leave it alone.

use super::{Aggregate, CostUnit, DEFAULT_AGGREGATE_PREFIXES, Mode, Policy, PolicyError, bad};

/// The limit flags of `limiter run`, typed. `None` = not given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    pub cost: Option<CostUnit>,
    pub v4_prefix: Option<u32>,
    pub v6_prefix: Option<u32>,
    pub capacity: Option<u32>,
    /// 0 turns the budget off; above 0 needs `new_source_burst`.
    pub new_source_rate: Option<u64>,
    pub new_source_burst: Option<u64>,
    /// Both or neither (the CLI enforces it).
    pub aggregate: Option<(u64, u64)>,
    pub aggregate_v4_prefix: Option<u32>,
    pub aggregate_v6_prefix: Option<u32>,
    /// Every class in shadow mode.
    pub shadow: bool,
}

impl Overlay {
    /// `p` with the given flags applied.
    pub fn apply(&self, mut p: Policy) -> Result<Policy, PolicyError> {
        let Self {
            rate,
            burst,
            cost,
            v4_prefix,
            v6_prefix,
            capacity,
            new_source_rate,
            new_source_burst,
            aggregate,
            aggregate_v4_prefix,
            aggregate_v6_prefix,
            shadow,
        } = self;
        let d = &mut p.default;
        d.rate = rate.unwrap_or(d.rate);
        d.burst = burst.unwrap_or(d.burst);
        d.cost = cost.unwrap_or(d.cost);
        p.v4_prefix = v4_prefix.unwrap_or(p.v4_prefix);
        p.v6_prefix = v6_prefix.unwrap_or(p.v6_prefix);
        p.capacity = capacity.unwrap_or(p.capacity);
        match (new_source_rate, new_source_burst) {
            (Some(0), _) => p.new_sources = None,
            (Some(r), Some(b)) => p.new_sources = Some((*r, *b)),
            (Some(_), None) => {
                return Err(bad("new_source_burst", "--new-source-rate above 0 needs --new-source-burst"));
            }
            (None, _) => {}
        }
        if let Some((rate, burst)) = *aggregate {
            let (v4_prefix, v6_prefix) = DEFAULT_AGGREGATE_PREFIXES;
            p.aggregate = Some(Aggregate { rate, burst, v4_prefix, v6_prefix });
        }
        if let Some(a) = p.aggregate.as_mut() {
            a.v4_prefix = aggregate_v4_prefix.unwrap_or(a.v4_prefix);
            a.v6_prefix = aggregate_v6_prefix.unwrap_or(a.v6_prefix);
        }
        if *shadow {
            p.default.mode = Mode::Shadow;
            for c in &mut p.classes {
                c.limit.mode = Mode::Shadow;
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_flags_replace_the_file_and_others_leave_it() {
        let file = Policy { v6_prefix: 48, ..Policy::default() };
        let o = Overlay {
            rate: Some(7),
            new_source_rate: Some(0),
            aggregate: Some((9, 18)),
            shadow: true,
            ..Overlay::default()
        };
        let p = o.apply(file.clone()).unwrap();
        assert_eq!((p.default.rate, p.default.burst, p.v6_prefix), (7, file.default.burst, 48));
        assert_eq!(p.new_sources, None);
        assert_eq!(p.aggregate, Some(Aggregate { rate: 9, burst: 18, v4_prefix: 16, v6_prefix: 40 }));
        assert_eq!(p.default.mode, Mode::Shadow);
        assert_eq!(Overlay::default().apply(file.clone()).unwrap(), file);
        let e = Overlay { new_source_rate: Some(5), ..Overlay::default() }.apply(file).unwrap_err();
        assert_eq!(e.field, "new_source_burst");
    }
}
