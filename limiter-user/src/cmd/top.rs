//! `limiter top`: a live view of pass and drop rates and top offenders.

use std::fmt::Write as _;

use super::table::{Align::Left, Align::Right, Table};

use crate::{
    control::{TopInfo, client::Client},
    top::{ascii_sparkline, sparkline},
};

pub fn top(client: Client, json: bool, once: bool, n: u16, interval: f64) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    // A screen redrawn in place on a terminal; into a pipe or a file, one
    // view after another with no control codes.
    let clear = !once && std::io::stdout().is_terminal();
    let var = |name: &str| std::env::var(name).ok();
    let utf8 = utf8_locale(var("LC_ALL"), var("LC_CTYPE"), var("LANG"));
    loop {
        let t = client.top(usize::from(n))?;
        if json {
            super::print_json(&t)?;
        } else {
            print!("{}", screen(&t, clear, utf8));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.1, 60.0)));
    }
}

/// Whether the locale the variables name (the first set of `LC_ALL`,
/// `LC_CTYPE`, `LANG`, as the C library reads them) writes UTF-8; unset,
/// it is `C`, which does not.
fn utf8_locale(all: Option<String>, ctype: Option<String>, lang: Option<String>) -> bool {
    let locale = [all, ctype, lang].into_iter().flatten().find(|v| !v.is_empty()).unwrap_or_default();
    let l = locale.to_ascii_lowercase();
    l.contains("utf-8") || l.contains("utf8")
}

fn screen(t: &TopInfo, clear: bool, utf8: bool) -> String {
    let spark = |v: &[u64]| if utf8 { sparkline(v) } else { ascii_sparkline(v) };
    let mut out = String::new();
    if clear {
        out.push_str("\x1b[H\x1b[2J"); // home, clear screen
    }
    let last = |v: &[u64]| v.last().copied().unwrap_or(0);
    let tail = |v: &[u64]| v[v.len().saturating_sub(60)..].to_vec();
    let _ = writeln!(out, "limiter top: drops sampled 1 in {}, rates over {} s", t.sample_every, t.window_secs);
    let _ = writeln!(out, "pass {:>10}/s  {}", last(&t.passed_per_sec), spark(&tail(&t.passed_per_sec)));
    let _ = writeln!(out, "drop {:>10}/s  {}", last(&t.dropped_per_sec), spark(&tail(&t.dropped_per_sec)));
    let mut table = Table::new(&[("prefix", Left), ("class", Left), ("drops/s", Right)]);
    for o in &t.offenders {
        table.row(vec![o.prefix.to_string(), o.class.clone(), o.drops_per_sec.to_string()]);
    }
    let _ = write!(out, "\n{}", table.render());
    if !t.shadow.is_empty() {
        // Shadow mode: what enforcing would drop (it passes now).
        let mut table = Table::new(&[("would drop (shadow)", Left), ("class", Left), ("drops/s", Right)]);
        for o in &t.shadow {
            table.row(vec![o.prefix.to_string(), o.class.clone(), o.drops_per_sec.to_string()]);
        }
        let _ = write!(out, "\n{}", table.render());
    }
    if !t.groups.is_empty() {
        let mut table = Table::new(&[("group", Left), ("passed/s", Right), ("dropped/s", Right)]);
        let mut groups = t.groups.clone();
        groups.sort_by(|a, b| b.dropped_per_sec.cmp(&a.dropped_per_sec).then_with(|| a.group.cmp(&b.group)));
        for g in &groups {
            table.row(vec![g.group.clone(), g.passed_per_sec.to_string(), g.dropped_per_sec.to_string()]);
        }
        let _ = write!(out, "\n{}", table.render());
    }
    if !t.backends.is_empty() {
        // Forwarded at the driver, per backend (the daemon sends the
        // busiest first).
        let mut table = Table::new(&[
            ("tunnel", Left),
            ("backend", Left),
            ("state", Left),
            ("packets/s", Right),
            ("bytes/s", Right),
        ]);
        for b in &t.backends {
            table.row(vec![
                b.tunnel.clone(),
                b.backend.to_string(),
                b.state.clone(),
                b.packets_per_sec.to_string(),
                b.bytes_per_sec.to_string(),
            ]);
        }
        let _ = write!(out, "\n{}", table.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_into_a_pipe_or_a_c_locale_has_no_codes_and_no_wide_bars() {
        let t = TopInfo {
            window_secs: 10,
            sample_every: 64,
            passed_per_sec: vec![0, 5, 10],
            dropped_per_sec: vec![3, 0, 1],
            offenders: Vec::new(),
            shadow: Vec::new(),
            groups: Vec::new(),
            backends: vec![crate::tunnel::BackendRate {
                tunnel: "web".to_owned(),
                backend: "198.18.9.1".parse().unwrap(),
                state: "drained".to_owned(),
                packets_per_sec: 1200,
                bytes_per_sec: 96_000,
            }],
        };
        let piped = screen(&t, false, false);
        assert!(piped.is_ascii(), "{piped}");
        assert!(piped.contains("_:#"), "{piped}");
        let backend = piped.lines().find(|l| l.starts_with("web ")).expect("a backend row");
        let cells: Vec<&str> = backend.split_whitespace().collect();
        assert_eq!(cells, ["web", "198.18.9.1", "drained", "1200", "96000"], "{piped}");
        assert!(screen(&t, true, true).starts_with("\x1b[H\x1b[2J"));
        assert!(screen(&t, false, true).contains("▁▄█"));
        let some = |v: &str| Some(v.to_owned());
        assert!(!utf8_locale(None, None, None), "unset is C");
        assert!(!utf8_locale(some("C"), some("en_US.UTF-8"), None), "LC_ALL wins");
        assert!(utf8_locale(some(""), None, some("en_US.utf8")), "an empty one is skipped");
        assert!(!utf8_locale(None, None, some("POSIX")));
    }
}
