//! Command-line flags laid over the policy file: each flag given replaces
//! the file's value; flags not given leave it alone.

use super::{Aggregate, CostUnit, DEFAULT_AGGREGATE_PREFIXES, Mode, Policy, PolicyError, bad};

/// The limit flags of `limiter run`: declared here once, flattened into
/// its arguments, and laid over the file by [`Overlay::apply`]. `None` =
/// not given.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct Overlay {
    /// Put every class in shadow mode: count would-be drops, drop nothing.
    #[arg(long)]
    pub shadow: bool,
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
    /// Tracked prefixes (LRU capacity) [default: 262144].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub capacity: Option<u32>,
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
            aggregate_rate,
            aggregate_burst,
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
        // Both or neither (the flags require each other).
        if let Some((rate, burst)) = aggregate_rate.zip(*aggregate_burst) {
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
            aggregate_rate: Some(9),
            aggregate_burst: Some(18),
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

    /// The defaults the flags' help gives are the built-in policy's: the
    /// values are declared once, in [`Policy::default`], and the help is
    /// held to them.
    #[test]
    fn the_help_of_each_flag_gives_the_built_in_default() {
        use clap::{Args, ValueEnum};
        let d = Policy::default();
        let (sources, sources_burst) = crate::policy::DEFAULT_NEW_SOURCES;
        let (agg_v4, agg_v6) = DEFAULT_AGGREGATE_PREFIXES;
        let cost = d.default.cost.to_possible_value().expect("a flag value").get_name().to_owned();
        let expected = [
            ("rate", d.default.rate.to_string()),
            ("burst", d.default.burst.to_string()),
            ("cost", cost),
            ("v4_prefix", d.v4_prefix.to_string()),
            ("v6_prefix", d.v6_prefix.to_string()),
            ("new_source_rate", format!("{sources}, burst {sources_burst}")),
            ("aggregate_rate", "off".to_owned()),
            ("aggregate_v4_prefix", agg_v4.to_string()),
            ("aggregate_v6_prefix", agg_v6.to_string()),
            ("capacity", d.capacity.to_string()),
        ];
        assert!(d.aggregate.is_none(), "the aggregate tier is off by default");
        assert_eq!(d.new_sources, Some((sources, sources_burst)));
        let cmd = Overlay::augment_args(clap::Command::new("run"));
        for (id, value) in expected {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no flag {id}"));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(help.contains(&format!("[default: {value}]")), "--{id}: {help:?} does not give {value}");
        }
    }
}
