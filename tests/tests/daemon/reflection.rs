//! A reflection class through the real `limiter run` on a veth: a flood
//! of amplified answers from ports 53 and 123 (spoofed, as a reflection
//! attack's reflectors send them: to whatever port of this host) is held
//! to the class's small budget per prefix, the same flood from another
//! port is not (the class takes source ports only), and this host's own
//! DNS client, asking a resolver all along whose prefix the port-53 flood
//! comes from (its bucket spent a hundred times over), gets every answer:
//! a refused answer to a socket this host connected passes (`own_answer`).
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    fmt::Write as _,
    net::UdpSocket,
    process::Output,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::require_root,
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, PORT, field, spawn_lines, unique_socket, wait_for},
};

/// The reflection class's budget per prefix.
const RATE: u64 = 200;
const BURST: u64 = 100;
/// The floods' length: the client's 3 s of queries start once the
/// floods hold the bucket, and end inside them.
const SECS: f64 = 6.0;
/// The resolver this host asks (its answers come from port 53 too).
const RESOLVER: &str = "198.18.50.1";
const QUERIES: u32 = 150;

fn policy(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("reflection.toml");
    let text = format!(
        "mode = \"enforce\"\nrate = 1000000\nburst = 1000000\n\n[[class]]\nname = \"reflection\"\nprotocol = \
         \"udp\"\nsource_ports = [53, 123]\nrate = {RATE}\nburst = {BURST}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A resolver in the sender's namespace: answers every query with its
/// own bytes, for `secs`.
fn resolve(secs: f64) -> u32 {
    let s = UdpSocket::bind((RESOLVER, 53)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let (until, mut answered, mut buf) = (Instant::now() + Duration::from_secs_f64(secs), 0, [0u8; 512]);
    while Instant::now() < until {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            s.send_to(&buf[..n], from).unwrap();
            answered += 1;
        }
    }
    answered
}

/// This host's DNS client: `QUERIES` queries at 50 a second from one
/// socket it opened, each waiting up to 1 s for its answer; the answers
/// it got.
fn ask() -> u32 {
    let s = UdpSocket::bind((B_ADDR, 0)).unwrap();
    s.connect((RESOLVER, 53)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let (start, mut got, mut buf) = (Instant::now(), 0, [0u8; 512]);
    for i in 0..QUERIES {
        if let Some(wait) = Duration::from_millis(20 * u64::from(i)).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let query = [&i.to_be_bytes()[..], b"\x01\x00\x00\x01example\x03org"].concat();
        s.send(&query).unwrap();
        // An answer to an earlier query that came late is skipped.
        while let Ok(n) = s.recv(&mut buf) {
            if buf[..n] == query[..] {
                got += 1;
                break;
            }
        }
    }
    got
}

/// Packets the daemon counted under `reason` (`limiter stats -j`).
fn counted(socket: &std::path::Path, reason: &str) -> Option<u64> {
    let stats: serde_json::Value = serde_json::from_slice(&scenario::cli(socket, &["stats", "-j"]).stdout).ok()?;
    stats["reasons"].as_array()?.iter().find(|r| r["reason"] == reason)?["packets"].as_u64()
}

#[test]
fn answers_from_reflection_ports_get_their_budget_and_the_hosts_own_dns_client_every_answer() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("rf");
    net.add_source(RESOLVER);
    let dir = limiter_tests::kernel::TempDir::new("reflection");
    let socket = unique_socket("rf");
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"]).arg(policy(&dir.0));
    c.arg("--socket").arg(&socket);
    let (_daemon, log) = spawn_lines(c).unwrap();
    wait_for(&log, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();

    let netload = env!("CARGO_BIN_EXE_netload");
    let mut recv = net.b.command(netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), &(SECS + 3.0).to_string()]);
    let (mut recv, recv_rx) = spawn_lines(recv).unwrap();
    wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    let mac = net.b_mac();

    let resolver = net.a.spawn_in(|| resolve(SECS + 3.0));
    let dst = format!("{B_ADDR}:{PORT}");
    // Reflectors in the resolver's own /24 answer from 53 (the resolver
    // among them), in .61 from 123; the same flood from .62 comes from
    // port 40000.
    let floods: Vec<_> = [("198.18.50", "53"), ("198.18.61", "123"), ("198.18.62", "40000")]
        .into_iter()
        .map(|(prefix, sport)| {
            let mut f = net.a.command(netload);
            f.args(["spoof-prefix", "va", &mac, &dst, prefix, "100000", &SECS.to_string(), sport]);
            (prefix, f.stdout(std::process::Stdio::piped()).spawn().unwrap())
        })
        .collect();
    // The client asks once the floods are refused (the port-53 bucket,
    // the resolver's, spent), so its answers come while it is.
    let waited = Instant::now();
    while counted(&socket, "rate_limited").unwrap_or(0) < 1000 {
        assert!(waited.elapsed() < Duration::from_secs_f64(SECS / 2.0), "the floods were not refused in {waited:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let client = net.b.spawn_in(ask);
    let floods: Vec<(&str, Output)> = floods.into_iter().map(|(p, f)| (p, f.wait_with_output().unwrap())).collect();
    let answers = client.join().unwrap();
    let answered = resolver.join().unwrap();
    assert!(recv.0.wait().unwrap().success());
    let recv_log: String = recv_rx.iter().map(|l| l + "\n").collect();
    let got = |prefix: &str| -> u64 {
        recv_log
            .lines()
            .filter(|l| l.starts_with(&format!("from {prefix}.")))
            .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
            .sum()
    };
    let own = counted(&socket, "own_answer").unwrap();
    let mut report = format!("client {answers}/{QUERIES} answers ({own} passed as own answers), resolver answered {answered}\n");
    for (prefix, o) in &floods {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        let sent = field(&out, "sent", 1).unwrap();
        let secs: f64 = out.split_whitespace().nth(3).unwrap().parse().unwrap();
        writeln!(report, "{prefix}: sent {sent} in {secs:.2} s, received {}", got(prefix)).unwrap();
    }
    println!("{report}");
    for (prefix, o) in &floods[..2] {
        let out = String::from_utf8_lossy(&o.stdout);
        let (sent, secs) = (field(&out, "sent", 1).unwrap(), out.split_whitespace().nth(3).unwrap().parse::<f64>().unwrap());
        let allowance = BURST as f64 + RATE as f64 * secs;
        // It was a flood: at least five times the class's allowance.
        assert!(sent as f64 >= 5.0 * allowance, "{prefix}: flood too weak\n{report}");
        // Held to the allowance (one lease per CPU and a jiffy at each
        // end beyond it), and given it.
        let bound = allowance + 2.0 * (BURST as f64 / 16.0) + RATE as f64 * 0.010 + 0.01 * RATE as f64 * secs;
        assert!(got(prefix) as f64 <= bound, "{prefix}: {} > {bound:.0}\n{report}", got(prefix));
        assert!(got(prefix) as f64 >= 0.9 * RATE as f64 * secs, "{prefix}: starved\n{report}");
    }
    // The same flood from a port no reflection class names is the default
    // class's, far above its allowance in the reflection class.
    let out = String::from_utf8_lossy(&floods[2].1.stdout);
    let sent = field(&out, "sent", 1).unwrap();
    assert!(got("198.18.62") as f64 >= 0.5 * sent as f64, "port 40000 was held\n{report}");
    // This host's DNS client, whose answers come from port 53 of the
    // flooded prefix, got every one.
    assert_eq!(answers, QUERIES, "{report}");
    // Its answers came through as its own while the flood held the
    // bucket (nearly all of them), and nothing else did: the flood, to a
    // socket bound but not connected, never.
    assert!((u64::from(QUERIES) / 2..=u64::from(QUERIES)).contains(&own), "{report}");
}
