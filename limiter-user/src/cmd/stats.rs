//! `limiter stats`.

use crate::control::client::Client;

pub fn stats(client: Client, json: bool, all: bool) -> anyhow::Result<()> {
    let s = client.stats()?;
    if json {
        return super::print_json(&s);
    }
    println!("{:<22} {:<11} {:>14} {:>16}", "reason", "action", "packets", "bytes");
    let (shown, zero): (Vec<_>, Vec<_>) = s.reasons.iter().partition(|r| all || r.packets > 0);
    for r in &shown {
        // A daemon of a build before `action` says the verdict only.
        let action = if r.action.is_empty() { &r.verdict } else { &r.action };
        println!("{:<22} {:<11} {:>14} {:>16}", r.reason, action, r.packets, r.bytes);
    }
    if !zero.is_empty() {
        println!("({} reasons at zero not shown; --all shows them)", zero.len());
    }
    println!("\n{:<22} {:>14} {:>14} {:>14}", "class", "admitted", "dropped", "shadow_dropped");
    for c in &s.classes {
        println!("{:<22} {:>14} {:>14} {:>14}", c.class, c.admitted, c.dropped, c.shadow_dropped);
    }
    if !s.syn_cookies.is_empty() {
        println!("\n{:<22} {:<8} {:>8}", "syn cookies", "mode", "engaged");
        for c in &s.syn_cookies {
            println!(
                "{:<22} {:<8} {:>8}",
                c.class,
                crate::policy::spelling(&c.mode),
                if c.engaged { "yes" } else { "no" }
            );
        }
    }
    Ok(())
}
