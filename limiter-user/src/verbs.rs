//! Operator verbs that talk to the running daemon, and the offline ones.
//! Human tables by default, one JSON document with `--json`.

use std::{fmt::Write as _, path::Path};

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::{
    cli::{Cli, PolicyCommand, PrefixCommand},
    control::{Request, Response, client},
    policy::{self, Policy},
    run::describe,
};

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn ask(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    Ok(client::call(socket, req)?)
}

/// `limiter unload`: remove the pins; the link goes with its last pin.
pub fn unload(args: &crate::cli::UnloadArgs, json: bool) -> anyhow::Result<()> {
    let removed = crate::pin::unload(&args.pin_dir, args.keep_maps)?;
    if json {
        let doc = serde_json::json!({ "pin_dir": args.pin_dir, "removed": removed, "kept_maps": args.keep_maps });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if removed.is_empty() {
        println!("limiter: nothing pinned in {}", args.pin_dir.display());
    } else {
        println!("limiter: removed {} from {}", removed.join(", "), args.pin_dir.display());
    }
    Ok(())
}

/// `limiter status`.
pub fn status(socket: &Path, json: bool) -> anyhow::Result<()> {
    let Response::Status(s) = ask(socket, &Request::Status)? else { anyhow::bail!("unexpected answer") };
    if json {
        return print_json(&s);
    }
    let mut out = String::new();
    let _ = writeln!(out, "interface       {} ({})", s.iface, s.attach_mode);
    let _ = writeln!(out, "pinned          {}", s.pin_dir.as_deref().unwrap_or("no"));
    let _ = writeln!(out, "policy          v{} from {}", s.policy_version, s.policy_source);
    let _ =
        writeln!(out, "                {}", s.policy.trim_start_matches(&format!("policy v{}: ", s.policy_version)));
    let _ = writeln!(out, "tracked         {}/{}", s.tracked, s.capacity);
    let _ = writeln!(out, "packets         {} passed, {} dropped", s.passed_packets, s.dropped_packets);
    let _ = writeln!(out, "uptime          {} s", s.uptime_secs);
    match &s.last_reload {
        Some(r) => {
            let _ = writeln!(
                out,
                "last reload     {} at {}: {}",
                if r.ok { "ok" } else { "FAILED" },
                r.unix_time,
                r.message
            );
        }
        None => out.push_str("last reload     none\n"),
    }
    print!("{out}");
    Ok(())
}

/// `limiter stats`.
pub fn stats(socket: &Path, json: bool) -> anyhow::Result<()> {
    let Response::Stats(s) = ask(socket, &Request::Stats)? else { anyhow::bail!("unexpected answer") };
    if json {
        return print_json(&s);
    }
    println!("{:<22} {:<8} {:>14} {:>16}", "reason", "verdict", "packets", "bytes");
    for r in &s.reasons {
        println!("{:<22} {:<8} {:>14} {:>16}", r.reason, r.verdict, r.packets, r.bytes);
    }
    println!("\n{:<22} {:>14} {:>14} {:>14}", "class", "admitted", "dropped", "shadow_dropped");
    for c in &s.classes {
        println!("{:<22} {:>14} {:>14} {:>14}", c.class, c.admitted, c.dropped, c.shadow_dropped);
    }
    Ok(())
}

/// `limiter policy ...`.
pub fn policy(cmd: &PolicyCommand, socket: &Path, json: bool) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check { file } => {
            let p = policy::file::load(file, &Policy::default()).context("invalid policy")?;
            let summary = describe(&p, 0).trim_start_matches("policy v0: ").to_owned();
            if json {
                return print_json(&serde_json::json!({ "file": file, "valid": true, "summary": summary }));
            }
            println!("{}: valid; {summary}", file.display());
            Ok(())
        }
        PolicyCommand::Apply { file } => {
            let req = match file {
                Some(f) => Request::PolicyApply {
                    name: f.display().to_string(),
                    text: Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?),
                },
                None => Request::PolicyApply { name: String::new(), text: None },
            };
            applied(ask(socket, &req)?, json)
        }
        PolicyCommand::Show => {
            let Response::Policy { version, source, text } = ask(socket, &Request::PolicyShow)? else {
                anyhow::bail!("unexpected answer")
            };
            if json {
                return print_json(&serde_json::json!({ "version": version, "source": source, "policy": text }));
            }
            print!("# policy v{version}, from {source}\n{text}");
            Ok(())
        }
    }
}

fn applied(r: Response, json: bool) -> anyhow::Result<()> {
    let Response::Applied { version, summary } = r else { anyhow::bail!("unexpected answer") };
    if json {
        return print_json(&serde_json::json!({ "version": version, "summary": summary }));
    }
    println!("applied {summary}");
    Ok(())
}

/// `limiter prefix ...`.
pub fn prefix(cmd: &PrefixCommand, socket: &Path, json: bool) -> anyhow::Result<()> {
    let req = match cmd {
        PrefixCommand::List => {
            let Response::Prefixes { version, entries } = ask(socket, &Request::PrefixList)? else {
                anyhow::bail!("unexpected answer")
            };
            if json {
                return print_json(&serde_json::json!({ "version": version, "overrides": entries }));
            }
            println!("{:<44} {:<7} {:>12} {:>12} {:<8}", "prefix", "action", "rate", "burst", "origin");
            for e in &entries {
                let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |n| n.to_string());
                println!("{:<44} {:<7} {:>12} {:>12} {:<8}", e.cidr, e.action, num(e.rate), num(e.burst), e.origin);
            }
            return Ok(());
        }
        PrefixCommand::Set { cidr, rate, burst } => {
            Request::PrefixSet { cidr: cidr.clone(), rate: *rate, burst: *burst }
        }
        PrefixCommand::Allow { cidr } => Request::PrefixAllow { cidr: cidr.clone() },
        PrefixCommand::Deny { cidr } => Request::PrefixDeny { cidr: cidr.clone() },
        PrefixCommand::Unset { cidr } => Request::PrefixUnset { cidr: cidr.clone() },
    };
    applied(ask(socket, &req)?, json)
}

/// `limiter completions SHELL`.
pub fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "limiter", &mut std::io::stdout());
}

/// `limiter man`.
pub fn man() -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
    Ok(())
}

/// `limiter replay`.
pub fn replay(pcap: &Path, policy_file: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let default = Path::new(policy::DEFAULT_PATH);
    let source = policy_file.or_else(|| default.is_file().then_some(default));
    let p = match source {
        Some(f) => policy::file::load(f, &Policy::default()).context("invalid policy")?,
        None => Policy::default(),
    };
    let frames = crate::replay::read_pcap(pcap)?;
    let rows = crate::replay::replay(&p, &frames)?;
    if json {
        return print_json(&serde_json::json!({ "frames": frames.len(), "prefixes": rows }));
    }
    println!("{:<44} {:>10} {:>10} {:>10} {:>14}", "prefix", "packets", "passed", "dropped", "shadow_dropped");
    for r in &rows {
        println!("{:<44} {:>10} {:>10} {:>10} {:>14}", r.prefix, r.packets, r.passed, r.dropped, r.shadow_dropped);
    }
    Ok(())
}

/// `limiter top`.
pub fn top(socket: &Path, json: bool, once: bool, n: u16, interval: f64) -> anyhow::Result<()> {
    let req = Request::Top { n: usize::from(n) };
    loop {
        let Response::Top(t) = ask(socket, &req)? else { anyhow::bail!("unexpected answer") };
        if json {
            print_json(&t)?;
        } else {
            let mut out = String::new();
            if !once {
                out.push_str("\x1b[H\x1b[2J"); // home, clear screen
            }
            let last = |v: &[u64]| v.last().copied().unwrap_or(0);
            let tail = |v: &[u64]| v[v.len().saturating_sub(60)..].to_vec();
            let _ = writeln!(out, "limiter top: drops sampled 1 in {}, rates over {} s", t.sample_every, t.window_secs);
            let _ = writeln!(
                out,
                "pass {:>10}/s  {}",
                last(&t.passed_per_sec),
                crate::top::sparkline(&tail(&t.passed_per_sec))
            );
            let _ = writeln!(
                out,
                "drop {:>10}/s  {}",
                last(&t.dropped_per_sec),
                crate::top::sparkline(&tail(&t.dropped_per_sec))
            );
            let _ = writeln!(out, "\n{:<44} {:<14} {:>14}", "prefix", "class", "drops/s");
            for o in &t.offenders {
                let _ = writeln!(out, "{:<44} {:<14} {:>14}", o.prefix, o.class, o.drops_per_sec);
            }
            print!("{out}");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.1, 60.0)));
    }
}
