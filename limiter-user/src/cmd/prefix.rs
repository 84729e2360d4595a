//! `limiter prefix list|set|allow|deny|unset|load`.

use super::table::{Align::Left, Align::Right, Table};
use crate::{
    cli::PrefixCommand,
    control::{Request, client::Client},
    policy::Action,
};

pub fn prefix(cmd: &PrefixCommand, client: Client, json: bool) -> anyhow::Result<()> {
    let req = match cmd {
        PrefixCommand::List => return list(client, json),
        PrefixCommand::Show { cidr } => return show(client, *cidr, json),
        PrefixCommand::Set { cidr, rate, burst, ttl, reason } => {
            Request::PrefixSet { cidr: *cidr, rate: *rate, burst: *burst, ttl_secs: *ttl, reason: reason.clone() }
        }
        PrefixCommand::Allow { cidr, ttl, reason } => {
            Request::PrefixAllow { cidr: *cidr, ttl_secs: *ttl, reason: reason.clone() }
        }
        PrefixCommand::Deny { cidr, ttl, upstream: true, reason } => {
            return deny_upstream(client, *cidr, *ttl, reason.clone(), json);
        }
        PrefixCommand::Deny { cidr, ttl, upstream: false, reason } => {
            Request::PrefixDeny { cidr: *cidr, ttl_secs: *ttl, upstream: false, reason: reason.clone() }
        }
        PrefixCommand::Unset { cidr: Some(cidr), .. } => Request::PrefixUnset { cidr: *cidr },
        PrefixCommand::Unset { cidr: None, origin, .. } => {
            use crate::origin::Origin;
            let origins =
                origin.map_or_else(|| vec![Origin::Operator, Origin::Feedback, Origin::Escalation], |o| vec![o]);
            Request::PrefixUnsetAll { origins }
        }
        PrefixCommand::Load { deny, allow, ttl } => return load(client, deny.as_deref(), allow.as_deref(), *ttl, json),
    };
    super::policy::print_applied(&client.change(&req)?, json)
}

/// `prefix deny --upstream`: one change, denied here and announced
/// upstream for the same time, or refused whole (no `[upstream]`, a
/// protected network, the cap full of the operator's own rules).
fn deny_upstream(
    client: Client,
    cidr: ipnet::IpNet,
    ttl: Option<u64>,
    reason: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let mut applied = client.change(&Request::PrefixDeny { cidr, ttl_secs: ttl, upstream: true, reason })?;
    let Some(info) = applied.upstream.take() else {
        anyhow::bail!("{cidr} is denied here (policy v{}); the daemon said nothing of upstream", applied.version);
    };
    if json {
        return super::print_json(&serde_json::json!({ "applied": applied, "upstream": info }));
    }
    super::policy::print_applied(&applied, false)?;
    println!("{cidr}: asked upstream ({}); `limiter upstream list` shows what the speaker holds", info.speaker);
    Ok(())
}

/// `prefix show`: the address's country, ASN and group when the policy
/// names groups, then one line per window-quota class.
fn show(client: Client, cidr: ipnet::IpNet, json: bool) -> anyhow::Result<()> {
    let s = client.prefix_show(cidr)?;
    if json {
        return super::print_json(&s);
    }
    println!("{}", s.cidr);
    if let Some(g) = &s.group {
        let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "unknown".into());
        println!("country: {}", or_unknown(g.country.clone()));
        println!("asn: {}", or_unknown(g.asn.map(|a| format!("AS{a}"))));
        match (&g.group, g.network) {
            (Some(name), Some(n)) => println!("group: {name} (its network {n}, the most specific holding it)"),
            (Some(name), None) => println!("group: {name}"),
            (None, _) => println!("group: none"),
        }
        println!("budget: {}", g.budget);
    }
    if s.windows.is_empty() {
        println!("no window-quota class in the policy (token buckets only)");
        return Ok(());
    }
    let mut t = Table::new(&[
        ("class", Left),
        ("scope", Left),
        ("limit", Right),
        ("local", Right),
        ("fleet", Right),
        ("left", Right),
        ("window", Right),
    ]);
    for w in &s.windows {
        t.row(vec![
            w.class.clone(),
            crate::policy::spelling(&w.scope),
            w.limit.to_string(),
            w.local.to_string(),
            w.fleet.to_string(),
            w.remaining.to_string(),
            format!("{} s / {}", w.window_secs, w.slices),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

/// `prefix load`: read the file (or stdin), send the CIDRs, and name the
/// line of an entry the daemon refuses.
fn load(
    client: Client,
    deny: Option<&std::path::Path>,
    allow: Option<&std::path::Path>,
    ttl: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let (path, action) = match (deny, allow) {
        (Some(p), _) => (p, Action::Deny),
        (None, Some(p)) => (p, Action::Allow),
        (None, None) => anyhow::bail!("give --deny FILE or --allow FILE"),
    };
    let name = path.display().to_string();
    // What one request may carry, checked before anything is read (a FIFO
    // or /dev/zero would block or grow this process without end).
    let max = u64::try_from(crate::control::server::MAX_LINE).unwrap_or(u64::MAX) / 2;
    let text = if name == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(std::io::stdin(), max + 1), &mut text)
            .context("reading standard input")?;
        anyhow::ensure!(text.len() as u64 <= max, "standard input: more than the {max} bytes a list may have");
        text
    } else {
        crate::policy::file::read_text(path, max, "a list").map_err(|e| anyhow::anyhow!("reading {name}: {e}"))?
    };
    let mut cidrs = Vec::new();
    let mut lines = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let net =
            l.parse::<ipnet::IpNet>().map_err(|e| anyhow::anyhow!("{name}:{}: {l:?} is not a CIDR: {e}", i + 1))?;
        cidrs.push(net);
        lines.push(i + 1);
    }
    let req = Request::PrefixLoad { cidrs, action, ttl_secs: ttl };
    match client.change(&req) {
        Ok(a) => super::policy::print_applied(&a, json),
        // The refused entry is the Nth CIDR: say its line instead.
        Err(crate::control::client::ClientError::Refused { entry: Some(i), message, .. }) if i < lines.len() => {
            anyhow::bail!("{name}:{}: {message}", lines[i])
        }
        Err(e) => Err(e.into()),
    }
}

fn list(client: Client, json: bool) -> anyhow::Result<()> {
    let l = client.prefix_list()?;
    if json {
        return super::print_json(&serde_json::json!({ "version": l.version, "overrides": l.entries, "more": l.more }));
    }
    let mut t = Table::new(&[
        ("prefix", Left),
        ("action", Left),
        ("rate", Right),
        ("burst", Right),
        ("origin", Left),
        ("expires in", Right),
        ("reason", Left),
    ]);
    let num = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let ttl = |s: Option<u64>| s.map_or_else(|| "never".to_owned(), super::human::duration);
    for e in &l.entries {
        let origin = e.source.clone().unwrap_or_else(|| e.origin.to_string());
        t.row(vec![
            e.cidr.to_string(),
            e.action.to_string(),
            num(e.rate),
            num(e.burst),
            origin,
            ttl(e.expires_in_secs),
            e.reason.clone().unwrap_or_default(),
        ]);
        // Every layer that spoke, highest first: the one in force, and
        // those beneath it (in force again when what is above them ends).
        for l in &e.layers {
            let mark = if l.in_force { "  in force:" } else { "  beneath:" };
            t.row(vec![
                mark.to_owned(),
                l.action.to_string(),
                num(l.rate),
                num(l.burst),
                l.layer.to_string(),
                ttl(l.expires_in_secs),
                String::new(),
            ]);
        }
    }
    print!("{}", t.render());
    if l.more > 0 {
        println!("... and {} more CrowdSec decisions (limiter_deny_networks counts them by origin)", l.more);
    }
    Ok(())
}
