//! `limiter replay`: verdicts per prefix of a capture, offline.

use std::path::Path;

use anyhow::Context as _;

use super::table::Align::{Left, Right};

use crate::{
    policy::{self, Loaded},
    replay::{Pcap, replay as run_replay},
};

pub fn replay(pcap: &Path, policy_file: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let loaded = match policy::resolve_path(policy_file) {
        Some(f) => policy::file::read(&f).context("invalid policy")?,
        None => Loaded::built_in(),
    };
    loaded.check().context("invalid policy")?;
    let report = run_replay(&loaded.policy, &mut Pcap::open(pcap)?)?;
    if json {
        return super::print_json(&report);
    }
    let mut t = super::table::Table::new(&[
        ("prefix", Left),
        ("packets", Right),
        ("passed", Right),
        ("dropped", Right),
        ("shadow_dropped", Right),
    ]);
    for r in &report.prefixes {
        let n = |v: u64| v.to_string();
        t.row(vec![r.prefix.clone(), n(r.packets), n(r.passed), n(r.dropped), n(r.shadow_dropped)]);
    }
    print!("{}", t.render());
    if report.reordered > 0 {
        println!(
            "{} of {} frames were stamped earlier than a frame before them: put back in order within {} frames; {} \
             later than that were replayed at the latest time already replayed (the data plane's clock never goes back)",
            report.reordered,
            report.frames,
            crate::replay::WINDOW_FRAMES,
            report.late
        );
    }
    Ok(())
}
