//! `limiter top`: a live view of pass and drop rates and top offenders.

use std::fmt::Write as _;

use super::table::{Align::Left, Align::Right, Table};

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
    let mut table = Table::new(&[("prefix", Left), ("class", Left), ("drops/s", Right)]);
    for o in &t.offenders {
        table.row(vec![o.prefix.to_string(), o.class.clone(), o.drops_per_sec.to_string()]);
    }
    let _ = write!(out, "\n{}", table.render());
    if !t.groups.is_empty() {
        let mut table = Table::new(&[("group", Left), ("passed/s", Right), ("dropped/s", Right)]);
        let mut groups = t.groups.clone();
        groups.sort_by(|a, b| b.dropped_per_sec.cmp(&a.dropped_per_sec).then_with(|| a.group.cmp(&b.group)));
        for g in &groups {
            table.row(vec![g.group.clone(), g.passed_per_sec.to_string(), g.dropped_per_sec.to_string()]);
        }
        let _ = write!(out, "\n{}", table.render());
    }
    out
}
