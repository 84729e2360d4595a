//! A LAPI that answers with 850,000 decisions, and then
//! sends them all again at every pull. It is the attacker here (a LAPI
//! taken over, or a man in the middle of its plain HTTP), so it is a
//! server this test writes, not CrowdSec: it answers what no CrowdSec
//! would. Decoded on the event loop and applied as one change, such an
//! answer takes the daemon's RSS from 15 to 887 MB, and the operator's
//! `prefix deny` waits up to 1.2 s behind a pull. The answer is decoded as it arrives, off the loop, and applied in parts
//! of 2,000 decisions, an operator's change waiting for one part at
//! most: this test measures the daemon's memory per decision and the
//! operator's latency under the pulls against its latency idle, in one
//! run.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpListener,
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{self, B_IF, VethPair},
    scenario::{self, spawn_lines, unique_socket, wait_for},
};

const DECISIONS: u32 = 850_000;
const PORT: u16 = 18_080;

/// The answer: `n` bans of addresses from 11.0.0.0 on, as compact as the
/// LAPI's JSON allows (under the daemon's 64 MiB bound).
fn answer(n: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(n as usize * 70);
    body.extend_from_slice(br#"{"deleted":null,"new":["#);
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        let a = std::net::Ipv4Addr::from(0x0b00_0000 + i);
        write!(body, r#"{{"id":{i},"scope":"ip","type":"ban","value":"{a}","duration":"4h"}}"#).unwrap();
    }
    body.extend_from_slice(b"]}");
    body
}

/// Serve `body` to every pull, from the daemon's namespace, until `stop`;
/// counts the pulls served.
fn hostile_lapi(ns: String, body: Arc<Vec<u8>>, stop: Arc<AtomicBool>, pulls: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        netns::enter(&ns);
        let listener = TcpListener::bind(("127.0.0.1", PORT)).unwrap();
        listener.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((conn, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            conn.set_nonblocking(false).unwrap();
            let mut r = BufReader::new(conn);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut conn = r.into_inner();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(&body)).is_ok() {
                pulls.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One `prefix deny` of the operator, timed.
fn operator_deny(socket: &Path, i: u32) -> Duration {
    let t = Instant::now();
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["prefix", "deny", &format!("198.19.{}.0/24", i % 256), "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    t.elapsed()
}

#[test]
fn a_huge_answer_sent_again_and_again_bounds_memory_and_never_holds_the_operator() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("csf");
    let tmp = TempDir::new("csf");
    let (keyfile, policy) = (tmp.0.join("key"), tmp.0.join("policy.toml"));
    std::fs::write(&keyfile, "hostile-lapi-key\n").unwrap();
    std::fs::write(
        &policy,
        format!(
            "[crowdsec]\nlapi_url = \"http://127.0.0.1:{PORT}\"\napi_key_file = \"{}\"\nupdate_frequency = \"1s\"\n",
            keyfile.display()
        ),
    )
    .unwrap();
    let socket = unique_socket("csf");
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&policy).arg("--socket").arg(&socket);
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "metrics on", scenario::DAEMON_START, &mut log).unwrap();
    let pid = daemon.0.id();
    // The operator idle (the LAPI not answering yet).
    let mut idle: Vec<Duration> = (0..7).map(|i| operator_deny(&socket, i)).collect();
    idle.sort();
    let before = rss_kb(pid);

    let body = Arc::new(answer(DECISIONS));
    let (stop, pulls) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    hostile_lapi(net.b.name.clone(), Arc::clone(&body), Arc::clone(&stop), Arc::clone(&pulls));
    // Sample the RSS while the operator works, through the startup pull
    // and at least two pulls more of the whole answer again.
    let start = Instant::now();
    let (mut peak, mut busy, mut i) = (before, Vec::new(), 100);
    let mut applied = false;
    while start.elapsed() < Duration::from_mins(2) && !(applied && pulls.load(Ordering::Relaxed) >= 4) {
        busy.push(operator_deny(&socket, i));
        i += 1;
        peak = peak.max(rss_kb(pid));
        std::thread::sleep(Duration::from_millis(150));
        for l in rx.try_iter() {
            applied |= l.contains("crowdsec: startup pull") && l.contains("850000 networks denied");
            log.push_str(&l);
            log.push('\n');
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(applied, "the startup pull was not applied: {log}");
    busy.sort();
    let (idle_median, busy_max) = (idle[idle.len() / 2], *busy.last().unwrap());
    let per_decision = (peak.saturating_sub(before)) * 1024 / u64::from(DECISIONS);
    println!(
        "answer {} MB, {} pulls; RSS {before} kB before, peak {peak} kB ({per_decision} B per decision); operator's prefix \
         deny idle: median {idle_median:?}; under the pulls: {} changes, median {:?}, max {busy_max:?} ({:.1}x the idle median)",
        body.len() >> 20,
        pulls.load(Ordering::Relaxed),
        busy.len(),
        busy[busy.len() / 2],
        busy_max.as_secs_f64() / idle_median.as_secs_f64()
    );
    // Decoded and applied whole: 887 MB for 850,000 decisions (over 1 kB
    // each), and the operator waiting up to 1.2 s (over 100x its idle
    // latency). In parts, a change waits for one part of 2,000 decisions at most: on these
    // machines' debug build, about 13x the idle latency at worst.
    assert!(per_decision <= 500, "{per_decision} B per decision");
    assert!(busy_max.as_secs_f64() <= 30.0 * idle_median.as_secs_f64(), "the operator waited {busy_max:?}");
}
