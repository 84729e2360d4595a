//! Command-line flags laid over the policy file: each flag given replaces
//! the file's value; flags not given leave it alone.

use super::{Mode, Policy, PolicyError, knobs::Knobs};

/// The flags of `limiter run` laid over the policy: the policy's knobs
/// (declared once, in [`Knobs`], which the file's top-level keys are too)
/// and `--shadow`. Flattened into its arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct Overlay {
    /// Put every class in shadow mode: count would-be drops, drop nothing.
    #[arg(long)]
    pub shadow: bool,
    #[command(flatten)]
    pub knobs: Knobs,
}

impl Overlay {
    /// `p` with the given flags applied.
    pub fn apply(&self, p: Policy) -> Result<Policy, PolicyError> {
        // Said as flags: `--new-source-rate needs --new-source-burst`.
        let flags = |problem: &str| {
            let flag = |w: &str| if w.contains('_') { format!("--{}", w.replace('_', "-")) } else { w.to_owned() };
            problem.split(' ').map(flag).collect::<Vec<_>>().join(" ")
        };
        let mut p = self.knobs.apply(p).map_err(|(e, _)| PolicyError { problem: flags(&e.problem), ..e })?;
        if self.shadow {
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
    use crate::policy::{Aggregate, DEFAULT_AGGREGATE_PREFIXES};

    #[test]
    fn given_flags_replace_the_file_and_others_leave_it() {
        let file = Policy { v6_prefix: 48, ..Policy::default() };
        let knobs = Knobs {
            rate: Some(7),
            new_source_rate: Some(0),
            aggregate_rate: Some(9),
            aggregate_burst: Some(18),
            ..Knobs::default()
        };
        let o = Overlay { shadow: true, knobs };
        let p = o.apply(file.clone()).unwrap();
        assert_eq!((p.default.rate, p.default.burst, p.v6_prefix), (7, file.default.burst, 48));
        assert_eq!(p.new_sources, None);
        assert_eq!(p.aggregate, Some(Aggregate { rate: 9, burst: 18, v4_prefix: 16, v6_prefix: 40 }));
        assert_eq!(p.default.mode, Mode::Shadow);
        assert_eq!(Overlay::default().apply(file.clone()).unwrap(), file);
        let knobs = Knobs { new_source_rate: Some(5), ..Knobs::default() };
        let e = Overlay { knobs, ..Overlay::default() }.apply(file).unwrap_err();
        assert_eq!(e.field, "new_source_burst");
        assert_eq!(e.problem, "--new-source-rate needs --new-source-burst");
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
