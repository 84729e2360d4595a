//! `limiter stats`.

use super::table::{Align::Left, Align::Right, Table};
use crate::control::client::Client;

pub fn stats(client: Client, json: bool, all: bool) -> anyhow::Result<()> {
    let s = client.stats()?;
    if json {
        return super::print_json(&s);
    }
    let mut t = Table::new(&[("reason", Left), ("action", Left), ("packets", Right), ("bytes", Right)]);
    let (shown, zero): (Vec<_>, Vec<_>) = s.reasons.iter().partition(|r| all || r.packets > 0);
    for r in &shown {
        // A daemon of a build before `action` says the verdict only.
        let action = if r.action.is_empty() { &r.verdict } else { &r.action };
        t.row(vec![
            r.reason.clone(),
            super::paint::verdict(action),
            r.packets.to_string(),
            super::table::size(r.bytes),
        ]);
    }
    print!("{}", t.render());
    if !zero.is_empty() {
        println!("({} reasons at zero not shown; --all shows them)", zero.len());
    }
    let mut t = Table::new(&[("class", Left), ("admitted", Right), ("dropped", Right), ("shadow_dropped", Right)]);
    for c in &s.classes {
        t.row(vec![c.class.clone(), c.admitted.to_string(), c.dropped.to_string(), c.shadow_dropped.to_string()]);
    }
    print!("\n{}", t.render());
    if !s.syn_cookies.is_empty() {
        let mut t = Table::new(&[("syn cookies", Left), ("mode", Left), ("engaged", Right)]);
        for c in &s.syn_cookies {
            let engaged = if c.engaged { "yes" } else { "no" };
            t.row(vec![c.class.clone(), crate::policy::spelling(&c.mode), engaged.to_owned()]);
        }
        print!("\n{}", t.render());
    }
    if !s.tcp_state.is_empty() {
        let mut t = Table::new(&[("tcp state", Left), ("mode", Left), ("judging", Right)]);
        for c in &s.tcp_state {
            let engaged = if c.engaged { "yes" } else { "no" };
            t.row(vec![c.class.clone(), crate::policy::spelling(&c.mode), engaged.to_owned()]);
        }
        print!("\n{}", t.render());
    }
    Ok(())
}
