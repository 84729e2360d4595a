//! `limiter status`.

use std::fmt::Write as _;

use crate::control::client::Client;

pub fn status(client: Client, json: bool) -> anyhow::Result<()> {
    let s = client.status()?;
    if json {
        return super::print_json(&s);
    }
    let mut out = String::new();
    let _ = writeln!(out, "interface       {} ({})", s.iface, s.attach_mode);
    match &s.detached_reason {
        None => {
            let _ = writeln!(out, "attached        yes ({} re-attachments since start)", s.reattaches);
        }
        Some(why) => {
            let _ = writeln!(out, "attached        {}: {why}", super::paint::red("NO, NOT ENFORCING"));
        }
    }
    let _ = writeln!(out, "pinned          {}", s.pin_dir.as_deref().unwrap_or("no"));
    let _ = writeln!(out, "policy          v{} from {}", s.policy_version, s.policy_source);
    let _ =
        writeln!(out, "                {}", s.policy.trim_start_matches(&format!("policy v{}: ", s.policy_version)));
    let _ = writeln!(out, "tracked         {}/{}", s.tracked, s.capacity);
    let _ = writeln!(out, "packets         {} passed, {} dropped", s.passed_packets, s.dropped_packets);
    let _ = writeln!(out, "uptime          {}", super::human::duration(s.uptime_secs));
    if let Some((priority, others)) = &s.dispatcher {
        let others: Vec<String> = others.iter().map(|(n, id, p)| format!("{n} (id {id}, priority {p})")).collect();
        let others = if others.is_empty() { "none".to_owned() } else { others.join(", ") };
        let _ = writeln!(out, "dispatcher      libxdp, the limiter at priority {priority}; others: {others}");
    }
    if let Some(lacks) = &s.kernel_lacks {
        let _ = writeln!(out, "syn cookies     NONE: {lacks}; the program runs without them");
    }
    tcp(&s, &mut out);
    for f in &s.forwards {
        let up = f.backends.iter().filter(|u| u.1).count();
        let shed: u64 = f.shed.iter().map(|x| x.1).sum();
        let _ = writeln!(
            out,
            "forward         {} on {}: {} open, {} accepted, {} shed, upstreams {up}/{} in service",
            f.name,
            f.listening.join(" "),
            f.active,
            f.accepted,
            shed,
            f.backends.len()
        );
        for e in &f.bind_errors {
            let _ = writeln!(out, "                NOT LISTENING: {e}");
        }
        let ranked: Vec<String> = f
            .by_criticality
            .iter()
            .filter(|(_, i, s)| i + s > 0)
            .map(|(c, i, s)| format!("{c} {i} in / {s} shed"))
            .collect();
        if !ranked.is_empty() {
            let _ = writeln!(out, "                by criticality: {}", ranked.join(", "));
        }
        if let Some(a) = f.adaptive.as_ref().filter(|a| a.refuse_probability > 0.0) {
            let _ = writeln!(
                out,
                "                THROTTLING: {:.0}% of new connections refused (last {} s: {} requests, {} accepted upstream, K {})",
                a.refuse_probability * 100.0,
                a.window_secs,
                a.requests,
                a.accepts,
                a.k
            );
        }
    }
    if !s.deny_set.is_empty() {
        let by: Vec<String> = s.deny_set.iter().map(|(o, n)| format!("{o} {n}")).collect();
        let _ = writeln!(out, "deny set        {}", by.join(", "));
    }
    if let Some(c) = &s.crowdsec {
        let _ = writeln!(out, "crowdsec        {c}");
    }
    if let Some(a) = &s.attacks {
        // The attack going on, then each webhook on a line of its own.
        for (i, part) in crate::escape_control(a).split("; ").enumerate() {
            let part = part.replacen("FAILING", &super::paint::red("FAILING"), 1);
            let part = if part.starts_with("ATTACK") { super::paint::red(&part) } else { part };
            let _ = writeln!(out, "{}{part}", if i == 0 { "attacks         " } else { "                " });
        }
    }
    if let Some(c) = &s.capture {
        let _ = writeln!(out, "capture         {}", crate::escape_control(c));
    }
    if let Some(t) = &s.tunnels {
        let _ = writeln!(out, "tunnels         {}", crate::escape_control(t));
    }
    if let Some(u) = &s.upstream {
        let _ = writeln!(out, "upstream        {}", crate::escape_control(u));
    }
    match &s.last_reload {
        Some(r) => {
            let ok = if r.ok { "ok" } else { "FAILED" };
            let at = super::human::when(r.unix_time, crate::clock::unix_now());
            let _ = writeln!(out, "last reload     {ok} at {at}: {}", r.message);
        }
        None => out.push_str("last reload     none\n"),
    }
    print!("{out}");
    Ok(())
}

/// What the TCP guards do now: the out-of-state check's classes, the
/// SYN cookies the kernel refuses.
fn tcp(s: &crate::control::StatusInfo, out: &mut String) {
    if !s.tcp_state_judging.is_empty() {
        let _ = writeln!(out, "tcp state       judging out-of-state TCP in class {}", s.tcp_state_judging.join(", "));
    }
    if let Some(why) = &s.syn_cookies_failing {
        let _ = writeln!(out, "syn cookies     {}: {why}", super::paint::red("FAILING"));
    }
}
