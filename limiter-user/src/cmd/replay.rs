//! `limiter replay`: verdicts per prefix of a capture, offline.

use std::path::Path;

use anyhow::Context as _;

use crate::{
    policy::{self, Loaded},
    replay::{read_pcap, replay as run_replay},
};

pub fn replay(pcap: &Path, policy_file: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let loaded = match policy::resolve_path(policy_file) {
        Some(f) => policy::file::read(&f).context("invalid policy")?,
        None => Loaded::built_in(),
    };
    loaded.check().context("invalid policy")?;
    let frames = read_pcap(pcap)?;
    let rows = run_replay(&loaded.policy, &frames)?;
    if json {
        return super::print_json(&serde_json::json!({ "frames": frames.len(), "prefixes": rows }));
    }
    println!("{:<44} {:>10} {:>10} {:>10} {:>14}", "prefix", "packets", "passed", "dropped", "shadow_dropped");
    for r in &rows {
        println!("{:<44} {:>10} {:>10} {:>10} {:>14}", r.prefix, r.packets, r.passed, r.dropped, r.shadow_dropped);
    }
    Ok(())
}
