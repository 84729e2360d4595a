//! `limiter history`: the audit trail as a table (when, who, what, how it
//! went), or its records as JSON.

use super::table::{Align::Left, Table};
use crate::{clock::human, control::client::Client};

pub fn history(client: Client, since: Option<std::time::Duration>, count: u16, json: bool) -> anyhow::Result<()> {
    let now = crate::clock::unix_now();
    let since = since.map(|d| now.saturating_sub(d.as_secs()));
    let h = client.history(since, usize::from(count))?;
    if json {
        return super::print_json(&h);
    }
    if h.records.is_empty() {
        println!("no change recorded{}", if since.is_some() { " in that time" } else { "" });
        return Ok(());
    }
    let mut t = Table::new(&[("when", Left), ("by", Left), ("change", Left), ("result", Left)]);
    for r in &h.records {
        let result = if r.ok {
            format!("v{}: {}", r.version, r.result)
        } else {
            format!("{}: {}", super::paint::red("REFUSED"), r.result)
        };
        t.row(vec![human::when(r.at, now), r.by.clone(), r.change.clone(), result]);
    }
    print!("{}", t.render());
    if h.file.is_none() {
        println!("(kept in memory since the daemon started: run it with --history FILE to keep them)");
    }
    Ok(())
}
