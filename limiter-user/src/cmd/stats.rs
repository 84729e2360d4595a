//! `limiter stats`.

use crate::control::client::Client;

pub fn stats(client: Client, json: bool) -> anyhow::Result<()> {
    let s = client.stats()?;
    if json {
        return super::print_json(&s);
    }
    println!("{:<22} {:<8} {:>14} {:>16}", "reason", "verdict", "packets", "bytes");
    for r in &s.reasons {
        println!("{:<22} {:<8} {:>14} {:>16}", r.reason, r.verdict, r.packets, r.bytes);
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
