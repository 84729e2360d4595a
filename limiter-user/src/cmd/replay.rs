//! `limiter replay`: verdicts per prefix of a capture, offline.

use std::path::Path;

use anyhow::Context as _;

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
    println!("{:<44} {:>10} {:>10} {:>10} {:>14}", "prefix", "packets", "passed", "dropped", "shadow_dropped");
    for r in &report.prefixes {
        println!("{:<44} {:>10} {:>10} {:>10} {:>14}", r.prefix, r.packets, r.passed, r.dropped, r.shadow_dropped);
    }
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
