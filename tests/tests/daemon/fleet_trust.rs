//! What a fleet peer, a writer to the store and a wrong clock can do to a
//! node (the adversarial suite's part for the fleet): a hostile writer's
//! counts are clamped at the limit and read only inside the window, a
//! huge heartbeat hash neither stalls a sync nor grows the daemon, a node
//! whose clock is 5 s ahead is reported and its slices are read on the
//! reader's clock, and the store's password is taken from a file and
//! never shown.

use std::{
    process::{Command, Output},
    thread,
    time::{Duration, Instant},
};

use limiter::control::client::Client;
use limiter_tests::{
    fleet::{Node, Redis, eventually, start_nodes, start_nodes_wrapped, wall_ns},
    kernel::{TempDir, require_root},
    scenario::{self, PORT},
};

const CLIENT: &str = "198.18.1.10";
const KEY: &str = "lim2:{quota|198.18.1.0/24}";

/// A fleet class of 60 a window of 6 s in 6 slices of 1 s.
fn policy(store: &str, nodes: u32, extra: &str) -> String {
    format!(
        "rate = 100000\nburst = 100000\n\n[[class]]\nname = \"quota\"\nprotocol = \"udp\"\nports = [{PORT}]\nlimit = 60\nwindow = \"6s\"\nslices = 6\nscope = \"fleet\"\n\n[fleet]\nstore = [{store:?}]\nnode = \"{{node}}\"\nnodes = {nodes}\nsync_interval = \"200ms\"\n{extra}"
    )
}

fn cli(node: &Node, args: &[&str]) -> Output {
    Command::new(scenario::locate_bin("limiter").unwrap())
        .args(args)
        .arg("--socket")
        .arg(&node.socket)
        .output()
        .unwrap()
}

fn seen(nodes: &[Node], n: usize) -> bool {
    nodes.iter().all(|x| {
        Client::new(&x.socket).fleet_status().ok().flatten().is_some_and(|f| f.store_up && f.nodes_seen.len() == n)
    })
}

/// The `fleet` column of `limiter prefix show CLIENT` on `node`.
fn fleet_count(node: &Node) -> u64 {
    let o = cli(node, &["prefix", "show", CLIENT]);
    let text = String::from_utf8_lossy(&o.stdout);
    let row = text.lines().find(|l| l.starts_with("quota")).unwrap_or_default().to_owned();
    row.split_whitespace().nth(4).and_then(|c| c.parse().ok()).unwrap_or(u64::MAX)
}

fn rss_kb(node: &Node) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{}/status", node.daemon.0.id())).unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap()
}

/// A writer to the store: 1e6 planted in the current and the next 24
/// slices must not refuse the prefix on every node, and 2M fields in
/// `lim:nodes` must not make every sync time out (the store DOWN
/// everywhere, the daemon's RSS 16 -> 141 MB).
#[test]
fn a_hostile_writer_is_clamped_and_a_huge_heartbeat_hash_stalls_nothing() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("fth");
    let redis = Redis::unix(&tmp.0);
    let nodes = start_nodes("fth", 2, &policy(&redis.url(), 2, ""), &[CLIENT], &tmp.0, |_| {});
    assert!(eventually(Duration::from_secs(10), || seen(&nodes, 2)), "the nodes never saw each other");
    let cur = wall_ns() / 1_000_000_000;
    // Slices without a node, a node nobody runs, and the real peer's
    // slices from the next one on: none of it is counted now.
    for s in cur..cur + 25 {
        for f in [s.to_string(), format!("evil/{s}")] {
            let _ = redis.cli(&["HSET", KEY, &f, "1000000"]);
        }
        // Far enough ahead that none becomes current while this runs.
        if s >= cur + 8 {
            let _ = redis.cli(&["HSET", KEY, &format!("n1/{s}"), "1000000"]);
        }
    }
    thread::sleep(Duration::from_millis(600));
    let got = scenario::delivered(&nodes[0].net, CLIENT, 20);
    assert_eq!(got, 20, "planted counts refused a client");
    // The peer's share of the window, written as the peer: counted, but
    // never for more than the limit.
    let _ = redis.cli(&["HSET", KEY, &format!("n1/{}", wall_ns() / 1_000_000_000), "1000000"]);
    thread::sleep(Duration::from_millis(600));
    let fleet = fleet_count(&nodes[0]);
    assert!(fleet <= 60, "a peer's share counted for {fleet}, past the limit of 60");
    let _ = redis.cli(&["DEL", KEY]);

    // 2,000,000 fields in the heartbeat hash.
    let before = rss_kb(&nodes[0]);
    let out = redis.cli(&[
        "EVAL",
        "for i = 1, 2000000 do redis.call('HSET', KEYS[1], 'junk' .. i, '1') end return redis.call('HLEN', KEYS[1])",
        "1",
        "lim:nodes",
    ]);
    assert!(out.trim().parse::<u64>().is_ok_and(|n| n >= 2_000_000), "{out}");
    // The EVAL itself blocks the store for seconds (syncs time out and
    // back off, at most 5 s): what is measured is the syncs once the
    // store answers again, each reading the huge hash.
    let done_ms = wall_ns() / 1_000_000;
    let synced_since = || {
        Client::new(&nodes[0].socket)
            .fleet_status()
            .ok()
            .flatten()
            .is_some_and(|f| f.store_up && f.last_sync_unix_ms.is_some_and(|t| t > done_ms))
    };
    assert!(eventually(Duration::from_secs(15), synced_since), "no sync after the EVAL in 15 s");
    let syncs = |n: &Node| Client::new(&n.socket).fleet_status().unwrap().unwrap().syncs;
    let (s0, at) = (syncs(&nodes[0]), Instant::now());
    thread::sleep(Duration::from_secs(4));
    let f = Client::new(&nodes[0].socket).fleet_status().unwrap().unwrap();
    let made = f.syncs - s0;
    println!(
        "with 2,000,000 heartbeat fields: {made} syncs in {:?}, last {:.2} ms, max {:.2} ms; RSS {before} -> {} kB",
        at.elapsed(),
        f.last_latency_ms,
        f.max_latency_ms,
        rss_kb(&nodes[0])
    );
    assert!(f.store_up && made >= 10, "syncs stalled: {made} in 4 s; {f:?}");
    assert!(f.heartbeat_fields >= 2_000_000, "{f:?}");
    // The EVAL blocked the store for seconds: n1's syncs timed out and
    // backed off (at most 5 s), so its heartbeat may be stale for a while
    // after; it must be found again by name all the same.
    let peer_seen = eventually(Duration::from_secs(12), || {
        Client::new(&nodes[0].socket).fleet_status().ok().flatten().is_some_and(|f| f.nodes_seen == ["n0", "n1"])
    });
    let f = Client::new(&nodes[0].socket).fleet_status().unwrap().unwrap();
    assert!(peer_seen, "the peer known by name is never seen again: {:?}", f.nodes_seen);
    let grown = rss_kb(&nodes[0]).saturating_sub(before);
    assert!(grown < 20_000, "the daemon grew by {grown} kB");
    let text = String::from_utf8_lossy(&cli(&nodes[0], &["fleet", "status"]).stdout).into_owned();
    assert!(text.contains("lim:nodes holds"), "{text}");

    // n1 silent longer than a heartbeat stays fresh (stopped): n0 drops
    // it. Once it beats again it must be found again by name, though the
    // 2,000,000 fields hide it from the one page scanned (a scan of one
    // page would lose it for good).
    let seen = |want: &[&str]| {
        Client::new(&nodes[0].socket).fleet_status().ok().flatten().is_some_and(|f| f.nodes_seen == want)
    };
    let n1 = i32::try_from(nodes[1].daemon.0.id()).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(n1, libc::SIGSTOP) };
    let dropped = eventually(Duration::from_secs(12), || seen(&["n0"]));
    // SAFETY: as above.
    unsafe { libc::kill(n1, libc::SIGCONT) };
    assert!(dropped, "a silent peer was never dropped");
    let back = Instant::now();
    let seen_again = eventually(Duration::from_secs(8), || seen(&["n0", "n1"]));
    println!("n1 silent, dropped, then seen again {:?} after it resumed", back.elapsed());
    assert!(seen_again, "a peer that went stale was never found again");
}

/// Node n1's clock 5 s ahead (libfaketime, the monotonic clock left alone
/// so its program's slices are 5 s ahead too): read on n1's clock, its
/// counts would stay in the other nodes' windows 5 s too long and refuse
/// a compliant client there, and nothing would say so. n0 reads
/// n1's slices on its own clock and both report the skew.
#[test]
fn a_node_with_a_skewed_clock_is_reported_and_read_on_the_readers_clock() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("ftk");
    let redis = Redis::unix(&tmp.0);
    // libfaketime preloaded by `env`, which execs the daemon (the
    // `faketime` wrapper forks, and killing it would orphan the daemon).
    let lib = std::fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(Result::ok)
        .map(|d| d.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists())
        .expect("libfaketime (cargo xtask setup installs faketime)");
    let wrap = |i: usize| {
        if i == 1 {
            vec![
                "env".into(),
                format!("LD_PRELOAD={}", lib.display()),
                "FAKETIME=+5s".into(),
                "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
            ]
        } else {
            Vec::new()
        }
    };
    let nodes = start_nodes_wrapped("ftk", 2, &policy(&redis.url(), 2, ""), &[CLIENT], &tmp.0, |_| {}, wrap);
    assert!(eventually(Duration::from_secs(10), || seen(&nodes, 2)), "the nodes never saw each other");
    let skewed = || Client::new(&nodes[0].socket).fleet_status().unwrap().unwrap().skewed;
    assert!(eventually(Duration::from_secs(5), || !skewed().is_empty()), "n0 never reported n1's clock");
    let s = skewed();
    assert!(s.len() == 1 && s[0].0 == "n1" && (4_500..=5_500).contains(&s[0].1), "{s:?}");
    let own = Client::new(&nodes[1].socket).fleet_status().unwrap().unwrap();
    assert!((4_500..=5_500).contains(&own.clock_offset_ms), "n1's own offset: {own:?}");
    let text = String::from_utf8_lossy(&cli(&nodes[0], &["fleet", "status"]).stdout).into_owned();
    assert!(text.contains("SKEWED      n1: +"), "{text}");
    // 30 through n1; 40 through n0 a second later: n1's 30 count now ...
    let start = Instant::now();
    assert_eq!(scenario::delivered(&nodes[1].net, CLIENT, 30), 30);
    thread::sleep(Duration::from_millis(800));
    let first = scenario::delivered(&nodes[0].net, CLIENT, 40);
    assert!((28..=32).contains(&first), "n0 admitted {first} of 40 with n1's 30 in the window");
    // ... and leave n0's window when they are a window old on n0's clock
    // (on n1's, they would stay 5 s longer: n0 would admit 30 of 40).
    let wait = Duration::from_millis(8_500).saturating_sub(start.elapsed());
    thread::sleep(wait);
    let later = scenario::delivered(&nodes[0].net, CLIENT, 40);
    assert_eq!(later, 40, "n1's counts stayed in n0's window past their time");
}

/// The store's password comes from `password_file`, and is
/// shown nowhere (`fleet status`, `policy show`, the log); without it the
/// log says NOAUTH plainly.
#[test]
fn the_store_password_comes_from_a_file_and_is_never_shown() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("ftp");
    let secret = "s3cret-fleet-password-4711";
    let mut redis = Redis::unix(&tmp.0);
    let _ = redis.cli(&["CONFIG", "SET", "requirepass", secret]);
    let pw = tmp.0.join("redis.password");
    std::fs::write(&pw, format!("{secret}\n")).unwrap();
    let extra = format!("password_file = {:?}\n", pw.display().to_string());
    let nodes = start_nodes("ftp", 1, &policy(&redis.url(), 1, &extra), &[CLIENT], &tmp.0, |_| {});
    assert!(eventually(Duration::from_secs(10), || seen(&nodes, 1)), "never synced with the password");
    for args in [&["fleet", "status"][..], &["fleet", "status", "--json"], &["policy", "show"]] {
        let o = cli(&nodes[0], args);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && !text.contains(secret), "limiter {args:?} shows the password: {text}");
    }
    // Without the file: NOAUTH, said plainly.
    let bare = start_nodes("ftq", 1, &policy(&redis.url(), 1, ""), &[CLIENT], &tmp.0, |_| {});
    let rx = bare[0].log.lock().unwrap();
    let mut log = String::new();
    let said = scenario::wait_for(&rx, "requires a password (NOAUTH)", Duration::from_secs(10), &mut log);
    assert!(said.is_ok(), "{log}");
    let rx0 = nodes[0].log.lock().unwrap();
    let all: String = rx0.try_iter().chain(rx.try_iter()).collect::<Vec<_>>().join("\n");
    assert!(!all.contains(secret) && !log.contains(secret), "the log shows the password");
    redis.kill();
}
