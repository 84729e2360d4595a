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
    let cookies = s.syn_cookies.iter().map(|c| (c.class.clone(), crate::policy::spelling(&c.mode), c.engaged));
    guard_table(("syn cookies", "engaged"), cookies);
    let state = s.tcp_state.iter().map(|c| (c.class.clone(), crate::policy::spelling(&c.mode), c.engaged));
    guard_table(("tcp state", "judging"), state);
    Ok(())
}

/// A TCP guard's classes (SYN cookies, the out-of-state check): each
/// with its mode and whether it acts now; nothing when none has it.
fn guard_table((title, acting): (&'static str, &'static str), rows: impl Iterator<Item = (String, String, bool)>) {
    let mut t = Table::new(&[(title, Left), ("mode", Left), (acting, Right)]);
    let mut any = false;
    for (class, mode, on) in rows {
        t.row(vec![class, mode, if on { "yes" } else { "no" }.to_owned()]);
        any = true;
    }
    if any {
        print!("\n{}", t.render());
    }
}
