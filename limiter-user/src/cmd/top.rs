//! `limiter top`: a live view of pass and drop rates and top offenders.

use std::fmt::Write as _;

use crate::{
    control::{TopInfo, client::Client},
    top::sparkline,
};

pub fn top(client: Client, json: bool, once: bool, n: u16, interval: f64) -> anyhow::Result<()> {
    loop {
        let t = client.top(usize::from(n))?;
        if json {
            super::print_json(&t)?;
        } else {
            print!("{}", screen(&t, !once));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.1, 60.0)));
    }
}

fn screen(t: &TopInfo, clear: bool) -> String {
    let mut out = String::new();
    if clear {
        out.push_str("\x1b[H\x1b[2J"); // home, clear screen
    }
    let last = |v: &[u64]| v.last().copied().unwrap_or(0);
    let tail = |v: &[u64]| v[v.len().saturating_sub(60)..].to_vec();
    let _ = writeln!(out, "limiter top: drops sampled 1 in {}, rates over {} s", t.sample_every, t.window_secs);
    let _ = writeln!(out, "pass {:>10}/s  {}", last(&t.passed_per_sec), sparkline(&tail(&t.passed_per_sec)));
    let _ = writeln!(out, "drop {:>10}/s  {}", last(&t.dropped_per_sec), sparkline(&tail(&t.dropped_per_sec)));
    let _ = writeln!(out, "\n{:<44} {:<14} {:>14}", "prefix", "class", "drops/s");
    for o in &t.offenders {
        let _ = writeln!(out, "{:<44} {:<14} {:>14}", o.prefix, o.class, o.drops_per_sec);
    }
    if !t.groups.is_empty() {
        let _ = writeln!(out, "\n{:<44} {:>14} {:>14}", "group", "passed/s", "dropped/s");
        let mut groups = t.groups.clone();
        groups.sort_by(|a, b| b.dropped_per_sec.cmp(&a.dropped_per_sec).then_with(|| a.group.cmp(&b.group)));
        for g in &groups {
            let _ = writeln!(out, "{:<44} {:>14} {:>14}", g.group, g.passed_per_sec, g.dropped_per_sec);
        }
    }
    out
}
