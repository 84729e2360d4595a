//! `limiter attacks [show ID]`: the attacks as a table (when, how long,
//! how big, from where), or one attack's whole record; `-j` gives the
//! records as the daemon keeps them.

use std::fmt::Write as _;

use super::table::{Align::Left, Align::Right, Table, bits_per_sec, size};
use crate::{
    cli::AttacksCommand,
    clock::human,
    control::{Attack, client::Client},
};

pub fn attacks(client: Client, show: Option<&AttacksCommand>, count: u16, json: bool) -> anyhow::Result<()> {
    let id = show.map(|AttacksCommand::Show { id }| *id);
    let answer = client.attacks(id, usize::from(count))?;
    if let Some(id) = id {
        let Some(a) = answer.attacks.first() else { anyhow::bail!("no attack {id} is kept") };
        if json {
            return super::print_json(a);
        }
        print!("{}", whole(a, crate::clock::unix_now()));
        return Ok(());
    }
    if json {
        return super::print_json(&answer);
    }
    if answer.attacks.is_empty() {
        println!("no attack recorded");
    } else {
        let now = crate::clock::unix_now();
        let mut t = Table::new(&[
            ("id", Right),
            ("started", Left),
            ("lasted", Right),
            ("state", Left),
            ("peak/s", Right),
            ("peak bits/s", Right),
            ("refused", Right),
            ("top source", Left),
        ]);
        for a in &answer.attacks {
            let top = a.sources.first().map_or_else(|| "-".into(), |s| format!("{} {:.0}%", s.name, s.share * 100.0));
            t.row(vec![
                a.id.to_string(),
                human::when(a.started, now),
                human::duration(a.duration_secs),
                if a.ended.is_none() { super::paint::red(state(a)) } else { state(a).into() },
                a.peak_pps.to_string(),
                bits_per_sec(a.peak_bps),
                a.refused.packets.to_string(),
                top,
            ]);
        }
        print!("{}", t.render());
    }
    if answer.file.is_none() {
        println!("(kept in memory since the daemon started: run it with --attacks FILE to keep them)");
    }
    Ok(())
}

fn state(a: &Attack) -> &'static str {
    match (a.ended, a.interrupted) {
        (None, _) => "GOING ON",
        (Some(_), true) => "cut short (the daemon stopped)",
        (Some(_), false) => "ended",
    }
}

/// One attack's whole record, as text.
fn whole(a: &Attack, now: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "attack {}: {}", a.id, state(a));
    let _ = writeln!(o, "started   {}", human::when(a.started, now));
    if let Some(end) = a.ended {
        let _ = writeln!(o, "ended     {}", human::when(end, now));
    }
    let _ = writeln!(o, "lasted    {} (above {} first)", human::duration(a.duration_secs), a.trigger);
    let _ = writeln!(o, "peak      {} packets/s, {} refused", a.peak_pps, bits_per_sec(a.peak_bps));
    let amount = |x: &crate::control::Amount| format!("{} packets, {}", x.packets, size(x.bytes));
    let _ = writeln!(o, "refused   {}", amount(&a.refused));
    if a.shadow.packets > 0 {
        let _ = writeln!(o, "  of them {} only in shadow (passed)", amount(&a.shadow));
    }
    if a.syn_cookies > 0 {
        let _ = writeln!(o, "  of them {} SYNs answered with a cookie", a.syn_cookies);
    }
    let _ = writeln!(o, "passed    {}", amount(&a.passed));
    if let Some(c) = &a.conforming {
        let _ = writeln!(
            o,
            "  of them about {} packets ({:.1}%) of {} source prefix(es) never refused (from {} passes drawn)",
            c.packets,
            c.share * 100.0,
            c.prefixes,
            c.samples
        );
    }
    let shares = |o: &mut String, title: &str, v: &[crate::control::Share]| {
        if v.is_empty() {
            return;
        }
        let _ = writeln!(o, "{title}");
        for s in v {
            let origin: Vec<String> = s.country.iter().cloned().chain(s.asn.map(|a| format!("AS{a}"))).collect();
            let origin = if origin.is_empty() { String::new() } else { format!("  ({})", origin.join(", ")) };
            let _ = writeln!(o, "  {:<40} {:>5.1}%  {}{origin}", s.name, s.share * 100.0, s.packets);
        }
    };
    shares(&mut o, "reasons", &a.reasons);
    shares(&mut o, &format!("classes (from {} sampled drops)", a.samples), &a.classes);
    shares(&mut o, "sources (from the sampled drops)", &a.sources);
    shares(&mut o, "ports (from the sampled drops)", &a.ports);
    if let Some(p) = &a.pcap {
        let full = if p.full { " (full: later frames not kept)" } else { "" };
        let _ = writeln!(o, "pcap      {} ({} frames, {}){full}", p.path, p.frames, size(p.bytes));
    }
    if a.actions.is_empty() {
        let _ = writeln!(o, "actions   none: no change of the policy state while it went on");
    } else {
        let _ = writeln!(o, "actions");
        for x in &a.actions {
            let done = if x.ok { String::new() } else { format!(" {}", super::paint::red("REFUSED")) };
            let _ = writeln!(o, "  {}  {}: {}{done}", human::when(x.at, now), x.by, x.what);
        }
        if a.actions_left_out > 0 {
            let _ = writeln!(o, "  ... and {} more", a.actions_left_out);
        }
    }
    o
}
