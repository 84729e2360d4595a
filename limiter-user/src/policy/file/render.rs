//! A policy back as a policy file.

use std::fmt::Write as _;

use crate::policy::{Limit, OverrideAction, Policy, Scope, spelling};

/// A bucket's rate and burst, or a window quota's fields.
fn limits(s: &mut String, l: &Limit) {
    let _ = match l.window {
        None => writeln!(s, "rate = {}\nburst = {}", l.rate, l.burst),
        Some(w) => {
            let _ = writeln!(
                s,
                "limit = {}\nwindow = \"{}ms\"\nslices = {}\nscope = \"{}\"",
                w.limit,
                w.length.as_millis(),
                w.slices,
                spelling(&w.scope)
            );
            if w.scope == Scope::Fleet {
                let _ = writeln!(s, "on_store_failure = \"{}\"", spelling(&w.on_store_failure));
            }
            Ok(())
        }
    };
}

/// The policy as a policy file that [`parse`] reads back to the same policy.
#[must_use]
pub fn render(p: &Policy) -> String {
    let d = p.default;
    let mut s = format!(
        "mode = \"{}\"\nrate = {}\nburst = {}\ncost = \"{}\"\nv4_prefix = {}\nv6_prefix = {}\ncapacity = {}\n",
        d.mode, d.rate, d.burst, d.cost, p.v4_prefix, p.v6_prefix, p.capacity
    );
    if p.allow_shrink {
        s.push_str("allow_shrink = true\n");
    }
    match p.new_sources {
        Some((rate, burst)) => {
            let _ = writeln!(s, "new_source_rate = {rate}\nnew_source_burst = {burst}");
        }
        None => s.push_str("new_source_rate = 0\n"),
    }
    if let Some(a) = p.aggregate {
        let _ = writeln!(
            s,
            "aggregate_rate = {}\naggregate_burst = {}\naggregate_v4_prefix = {}\naggregate_v6_prefix = {}",
            a.rate, a.burst, a.v4_prefix, a.v6_prefix
        );
    }
    for c in &p.classes {
        let l = c.limit;
        let _ = write!(s, "\n[[class]]\nname = {:?}\nprotocol = \"{}\"\n", c.name, c.protocol);
        if !c.ports.is_empty() {
            let ports: Vec<String> = c
                .ports
                .iter()
                .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("\"{lo}-{hi}\"") })
                .collect();
            let _ = writeln!(s, "ports = [{}]", ports.join(", "));
        }
        if c.syn {
            s.push_str("syn = true\n");
        }
        let _ = writeln!(s, "cost = \"{}\"\nmode = \"{}\"", l.cost, l.mode);
        limits(&mut s, &l);
        if c.syn_cookies != crate::policy::SynCookies::Off {
            let _ = writeln!(s, "syn_cookies = \"{}\"", spelling(&c.syn_cookies));
        }
        if let Some(r) = c.syn_rate {
            let _ = writeln!(s, "syn_rate = {r}");
        }
    }
    for o in &p.overrides {
        let _ = write!(s, "\n[[override]]\ncidr = \"{}\"\n", o.net);
        match o.action {
            OverrideAction::Allow => s.push_str("action = \"allow\"\n"),
            OverrideAction::Deny => s.push_str("action = \"deny\"\n"),
            OverrideAction::Limit(l) => {
                let _ = writeln!(s, "mode = \"{}\"", l.mode);
                limits(&mut s, &l);
            }
        }
    }
    services(&mut s, p);
    s
}

/// The forwarders, the feedback endpoint and the fleet store.
fn services(s: &mut String, p: &Policy) {
    for f in &p.forwards {
        let list = |v: &[std::net::SocketAddr]| v.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
        let _ = write!(
            *s,
            "\n[[forward]]\nname = {:?}\nlisten = [{}]\nupstreams = [{}]\nbalance = \"{}\"\nproxy_protocol = \"{}\"\ncopy = \"{}\"\n",
            f.name,
            list(&f.listen),
            list(&f.upstreams),
            crate::policy::spelling(&f.balance),
            crate::policy::spelling(&f.proxy_protocol),
            crate::policy::spelling(&f.copy),
        );
        let ms = |d: std::time::Duration| format!("{}ms", d.as_millis());
        let _ = writeln!(
            *s,
            "max_connections = {}\nmax_connections_per_prefix = {}\nconnect_timeout = \"{}\"\nidle_timeout = \"{}\"\ndrain_timeout = \"{}\"",
            f.max_connections,
            f.max_connections_per_prefix,
            ms(f.connect_timeout),
            ms(f.idle_timeout),
            ms(f.drain_timeout)
        );
    }
    if let Some(f) = &p.feedback {
        let _ = write!(
            *s,
            "\n[feedback]\nlisten = \"{}\"\ntoken_file = {:?}\nmax_denied = {}\nmin_v4_prefix = {}\nmin_v6_prefix = {}\nmax_ttl = \"{}s\"\nshadow = {}\nmay_override_allow = {}\n",
            f.listen,
            f.token_file.display().to_string(),
            f.max_denied,
            f.min_v4_prefix,
            f.min_v6_prefix,
            f.max_ttl.as_secs(),
            f.shadow,
            f.may_override_allow
        );
        if let Some(e) = &f.escalate {
            let _ = write!(
                s,
                "\n[feedback.escalate]\ndrops_per_sec = {}\nsustained = \"{}ms\"\ndeny_for = \"{}s\"\nmax_denied = {}\n",
                e.drops_per_sec,
                e.sustained.as_millis(),
                e.deny_for.as_secs(),
                e.max_denied
            );
        }
    }
    if let Some(f) = &p.fleet {
        // A password in an address is never shown (`policy show`).
        let list: Vec<String> = f.store.iter().map(|a| format!("{:?}", crate::policy::fleet::redacted(a))).collect();
        let _ = write!(
            *s,
            "\n[fleet]\nstore = [{}]\nnode = {:?}\nnodes = {}\nsync_interval = \"{}ms\"\ntimeout = \"{}ms\"\n",
            list.join(", "),
            f.node,
            f.nodes,
            f.sync_interval.as_millis(),
            f.timeout.as_millis()
        );
        if let Some(pw) = &f.password_file {
            let _ = writeln!(*s, "password_file = {:?}", pw.display().to_string());
        }
    }
}
