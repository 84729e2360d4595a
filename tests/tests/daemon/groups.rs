//! Country and ASN groups through the real `limiter run` on a veth, from
//! a list in the common `network,asn` form: a flood spread over the 256
//! /24s of one autonomous system, each /24 far inside its own bucket's
//! rate, is held together to the group's shared budget; a client of
//! another AS loses nothing under it; a denied AS is dropped but for the
//! /24 the operator allows; the metrics count each group's packets and
//! `limiter prefix show` names an address's ASN, group and budget. A new
//! version of the file moves a network from one group to another.
//! (The readers of the real databases are tested on the registry's
//! current files in the system tier; a test bed's traffic comes from the
//! benchmarking range, which no real file holds.)
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::require_root,
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, PORT, cli, field, metric, scrape, spawn_lines, unique_socket, wait_for},
};

/// The flooded group's budget (packets/s, and burst).
const RATE: u64 = 2_000;
const BURST: u64 = 1_000;
/// The flood: nine to ten times the group's rate.
const FLOOD_PPS: u64 = 20_000;
const SECS: f64 = 3.0;
/// A client of another AS, well inside its prefix's rate.
const CLIENT: &str = "198.18.200.7";
const CLIENT_PPS: u64 = 300;
/// A sender in the denied AS, and one in its /24 the operator allows.
const DENIED: &str = "198.18.210.7";
const ALLOWED: &str = "198.18.211.7";

fn list(asn_of_flooded: u32) -> String {
    format!(
        "network,asn,name\n198.19.0.0/16,{asn_of_flooded},Flooded\n198.18.200.0/24,64501,Client\n198.18.210.0/23,\
         64502,Denied\n"
    )
}

/// The policy: a rate group of each of AS64500 and AS64501 (whose
/// guards let next month's file move the /16 from one to the other: the
/// defaults would refuse a version that grows or shrinks that much, see
/// `adversarial::groups`) and AS64502 denied.
fn policy(dir: &std::path::Path, csv: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("groups.toml");
    let csv = csv.display();
    let text = format!(
        "rate = 1000\nburst = 2000\n\n[[override]]\ncidr = \"198.18.211.0/24\"\naction = \"allow\"\n\n[[group]]\nname \
         = \"as64500\"\npath = \"{csv}\"\nasns = [64500]\nmax_growth = 1000.0\nmax_shrink = 1.0\nrate = {RATE}\nburst = {BURST}\nallow_bogons = \
         true\n\n[[group]]\nname = \"as64501\"\npath = \"{csv}\"\nasns = [64501]\nmax_growth = 1000.0\nmax_shrink = 1.0\nrate = 5000\nallow_bogons = \
         true\n\n[[group]]\nname = \"as64502\"\npath = \"{csv}\"\nasns = [64502]\naction = \"deny\"\nallow_bogons = \
         true\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `limiter prefix show ADDR` against the daemon on `socket`.
fn show(socket: &std::path::Path, addr: &str) -> String {
    let o = cli(socket, &["prefix", "show", addr]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Packets `recv`'s log counts from sources starting with `prefix`.
fn got(log: &str, prefix: &str) -> u64 {
    log.lines()
        .filter(|l| l.starts_with(&format!("from {prefix}")))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_group_shares_one_budget_over_its_prefixes_and_a_client_of_another_loses_nothing() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("gr");
    for a in [CLIENT, DENIED, ALLOWED] {
        net.add_source(a);
    }
    let dir = limiter_tests::kernel::TempDir::new("groups");
    let csv = dir.0.join("asn.csv");
    std::fs::write(&csv, list(64500)).unwrap();
    let socket = unique_socket("gr");
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(policy(&dir.0, &csv));
    c.arg("--socket").arg(&socket);
    let (_daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    for g in ["as64500: 1 networks", "as64501: 1 networks", "as64502: 1 networks"] {
        let g = format!("group {g}");
        if !seen.contains(&g) {
            wait_for(&log, &g, Duration::from_secs(20), &mut seen).unwrap();
        }
    }

    let netload = env!("CARGO_BIN_EXE_netload");
    let mut recv = net.b.command(netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), &(SECS + 3.0).to_string()]);
    let (mut recv, recv_rx) = spawn_lines(recv).unwrap();
    wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    let dst = format!("{B_ADDR}:{PORT}");
    let senders: Vec<_> = [CLIENT, DENIED, ALLOWED]
        .into_iter()
        .map(|src| {
            let mut s = net.a.command(netload);
            s.args(["send", src, &dst, &CLIENT_PPS.to_string(), &SECS.to_string()]);
            (src, s.stdout(std::process::Stdio::piped()).spawn().unwrap())
        })
        .collect();
    let mut flood = net.a.command(netload);
    flood.args(["spoof-prefix", "va", &net.b_mac(), &dst, "198.19", &FLOOD_PPS.to_string(), &SECS.to_string()]);
    let flood = flood.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Two seconds into the flood, `limiter top` shows the group's drops.
    std::thread::sleep(Duration::from_secs(2));
    let top = cli(&socket, &["top", "--once", "--json"]);
    let top: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap();
    let flood = flood.wait_with_output().unwrap();
    assert!(flood.status.success(), "{}", String::from_utf8_lossy(&flood.stderr));
    let sent: Vec<(&str, u64)> = senders
        .into_iter()
        .map(|(src, s)| {
            let o = s.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            (src, field(&String::from_utf8_lossy(&o.stdout), "sent", 1).unwrap())
        })
        .collect();
    assert!(recv.0.wait().unwrap().success());
    let recv_log: String = recv_rx.iter().map(|l| l + "\n").collect();
    let out = String::from_utf8_lossy(&flood.stdout);
    let (flood_sent, secs) = (field(&out, "sent", 1).unwrap(), out.split_whitespace().nth(3).unwrap().parse::<f64>().unwrap());
    let text = scrape(&net);
    let packets = |g: &str, action: &str| metric(&text, &format!("limiter_group_packets_total{{group=\"{g}\",action=\"{action}\"}}"));
    let mut report = format!(
        "flood over 198.19.0.0/16: sent {flood_sent} in {secs:.2} s, received {}; group as64500 pass {} drop {}\n",
        got(&recv_log, "198.19."),
        packets("as64500", "pass"),
        packets("as64500", "drop")
    );
    for (src, n) in &sent {
        writeln!(report, "{src}: sent {n}, received {}", got(&recv_log, &format!("{src} "))).unwrap();
    }
    println!("{report}");

    // A flood nine times the group's allowance, spread so thin that no
    // prefix's own bucket (1,000/s) ever refuses: the group admits its
    // allowance, within 5%.
    let allowance = BURST as f64 + RATE as f64 * secs;
    assert!(flood_sent as f64 >= 9.0 * RATE as f64 * secs * 0.9, "flood too weak\n{report}");
    let admitted = got(&recv_log, "198.19.") as f64;
    assert!(admitted <= 1.05 * allowance && admitted >= 0.95 * RATE as f64 * secs, "{admitted} vs {allowance}\n{report}");
    // Every packet of the group was counted, as passed or dropped.
    let counted = packets("as64500", "pass") + packets("as64500", "drop");
    assert!(counted as f64 >= 0.99 * flood_sent as f64 && counted <= flood_sent, "{counted} of {flood_sent}\n{report}");
    // The client of another AS lost nothing; the denied AS got nothing
    // but where the operator's `allow` outranks its group.
    let received = |src: &str| got(&recv_log, &format!("{src} "));
    for (src, n) in &sent {
        match *src {
            DENIED => assert_eq!(received(src), 0, "{report}"),
            _ => assert_eq!(received(src), *n, "{src}\n{report}"),
        }
    }
    assert!(packets("as64502", "drop") >= sent[1].1, "{report}");
    assert_eq!(metric(&text, "limiter_group_networks{group=\"as64500\"}"), 1);
    let row = |g: &str| top["groups"].as_array().unwrap().iter().find(|r| r["group"] == g).cloned().unwrap();
    println!("limiter top, 2 s into the flood: {}", top["groups"]);
    // A second of it: about 18,000 dropped and 2,000 passed.
    let (passed, dropped) = (row("as64500")["passed_per_sec"].as_u64().unwrap(), row("as64500")["dropped_per_sec"].as_u64().unwrap());
    assert!(dropped as f64 >= 0.5 * (FLOOD_PPS - RATE) as f64 && passed as f64 <= 1.5 * RATE as f64, "{top}");
    assert_eq!(row("as64502")["passed_per_sec"], 0, "{top}");
    assert!(text.contains("limiter_group_file_age_seconds{group=\"as64500\"} "), "{text}");

    let show = |addr: &str| show(&socket, addr);
    let s = show("198.19.5.9");
    assert!(s.contains("asn: AS64500") && s.contains("group: as64500") && s.contains("2000/s"), "{s}");
    let s = show("198.18.77.1");
    assert!(s.contains("group: none") && s.contains("asn: unknown"), "{s}");

    next_month(&log, &csv, &socket, &mut seen);
}

/// Next month's file: the /16 moved to AS64501. The daemon reads it
/// within its check interval and moves the network between groups (each
/// group's version in turn: until AS64500's leaves the /16, the first
/// group of the policy holds it).
fn next_month(log: &std::sync::mpsc::Receiver<String>, csv: &std::path::Path, socket: &std::path::Path, seen: &mut String) {
    let t = Instant::now();
    std::fs::write(csv, list(64501)).unwrap();
    for line in ["group as64501: 2 networks (1 added, 0 removed;", "group as64500: 0 networks (0 added, 1 removed;"] {
        if !seen.contains(line) {
            wait_for(log, line, Duration::from_secs(20), seen).unwrap();
        }
    }
    let s = show(socket, "198.19.5.9");
    assert!(s.contains("asn: AS64501") && s.contains("group: as64501"), "{s}");
    println!("the new file was in force after {:.1} s", t.elapsed().as_secs_f64());
}

/// The first address of the first network `table` tags with `want`.
fn address_of(table: &limiter::groups::Table, want: impl Fn(&limiter::groups::Tag) -> bool) -> std::net::IpAddr {
    let (n, _) = table.networks.iter().find(|(n, t)| want(t) && n.addr().is_ipv4()).expect("a network");
    n.network()
}

#[test]
fn a_real_country_database_and_asn_list_load_whole_and_name_real_addresses() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let geolite = limiter_tests::data::ip_location_db("geolite2-country-mmdb", "geolite2-country.mmdb");
    let asn = limiter_tests::data::ip_location_db("asn", "asn-ipv4.csv");
    // Copies the test may touch, as a monthly download replaces a file.
    let dir = limiter_tests::kernel::TempDir::new("groups-real");
    let (geolite_copy, asn_copy) = (dir.0.join("country.mmdb"), dir.0.join("asn.csv"));
    std::fs::copy(&geolite, &geolite_copy).unwrap();
    std::fs::copy(&asn, &asn_copy).unwrap();
    let policy = dir.0.join("real.toml");
    std::fs::write(
        &policy,
        format!(
            "rate = 1000\nburst = 2000\n\n[[group]]\nname = \"cloudflare\"\npath = \"{}\"\nasns = [13335]\naction = \
             \"allow\"\n\n[[group]]\nname = \"de\"\npath = \"{}\"\ncountries = [\"DE\"]\nrate = 50000\n",
            asn_copy.display(),
            geolite_copy.display()
        ),
    )
    .unwrap();
    // What the daemon should hold: the files as the tests' own reading of
    // them (the readers are checked against the files' text in the
    // system tier), selected and left no finer than /24.
    let table = |p: &std::path::Path| limiter::groups::read(p).unwrap();
    let (countries, asns) = (table(&geolite), table(&asn));
    let want = |t: &limiter::groups::Table, c: &[[u8; 2]], a: &[u32]| limiter::nets::coarsen(t.select(c, a), 24, 56);
    let (de, left_de) = want(&countries, &[*b"DE"], &[]);
    let (cf, _) = want(&asns, &[], &[13335]);

    let net = VethPair::new("gq");
    let socket = unique_socket("gq");
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&policy).arg("--socket").arg(&socket);
    let (_daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    for line in [format!("group de: {} networks", de.len()), format!("group cloudflare: {} networks", cf.len())] {
        if !seen.contains(&line) {
            wait_for(&log, &line, Duration::from_mins(1), &mut seen).unwrap();
        }
    }
    let text = scrape(&net);
    assert_eq!(metric(&text, "limiter_group_networks{group=\"de\"}"), de.len() as u64);
    assert_eq!(metric(&text, "limiter_group_left_out_networks{group=\"de\"}"), left_de as u64);
    let show = |addr: &str| show(&socket, addr);
    let s = show("1.1.1.1");
    assert!(s.contains("asn: AS13335") && s.contains("group: cloudflare") && s.contains("allowed"), "{s}");
    let german = address_of(&countries, |t| t.country == Some(*b"DE")).to_string();
    let s = show(&german);
    println!("{german}:\n{s}");
    assert!(s.contains("country: DE"), "{s}");
    // Its /24 is the group's unless the file splits it (then no group's).
    let whole = de.iter().any(|n| n.contains(&german.parse::<std::net::IpAddr>().unwrap()));
    assert_eq!(s.contains("group: de"), whole, "{s}");
    // The same file written again (a download that changed nothing): read
    // again, and nothing moves.
    std::fs::copy(&geolite, &geolite_copy).unwrap();
    wait_for(&log, "group de: ", Duration::from_secs(30), &mut seen).unwrap();
    let last = seen.lines().rev().find(|l| l.contains("group de: ")).unwrap().to_owned();
    println!("{}", seen.lines().filter(|l| l.contains("group ")).collect::<Vec<_>>().join("\n"));
    assert!(last.contains("(0 added, 0 removed"), "{last}");
}
