//! Fleet-wide window quotas with the real parts: a `redis-server` (and a
//! 3-master Redis Cluster) started here, 3 daemons each on its own veth
//! pair, and one client prefix's packets spread at random over them.
//!
//! Time is scaled by 1/10 from the case study: a window of 6 s in 12
//! slices of 0.5 s. The 9x test keeps the case study's limit of 600 a
//! window and scales the rates (900/s against 100/s) and the sync
//! interval (20 ms for 0.2 s) with it, so each sync interval carries the
//! same share of the limit as in the study; the at-the-rate and outage
//! tests run the default 200 ms sync with 60 a window (10/s).
#![expect(clippy::cast_precision_loss, reason = "ratios printed for reading")]

use std::{thread, time::Duration};

use limiter::control::client::Client;
use limiter_tests::{
    fleet::{Cluster, Flow, Node, Redis, busiest, eventually, run, schedule, start_nodes, wall_ns as fleet_wall_ns},
    kernel::{TempDir, require_root},
    scenario::PORT,
};

const SLICE_NS: u64 = 500_000_000;
const WINDOW_NS: u64 = 12 * SLICE_NS;
const CLIENT: &str = "198.18.1.10";
const CALM: &str = "198.18.2.10";
/// A client under a fleet-scope window override.
const OVR: &str = "198.18.3.10";

mod setup;

use self::setup::*;

#[test]
fn a_client_at_nine_times_its_rate_gets_at_most_1_1x_through_the_fleet() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("fl9");
    let redis = Redis::unix(&tmp.0);
    let nodes = start_nodes("fl9", 3, &policy(&[redis.url()], 600, 20), &[CLIENT], &tmp.0, |_| {});
    nine_times(&nodes);
    // One hash per (class, prefix), hash-tagged.
    let keys = redis.cli(&["--scan", "--pattern", "lim2:{*"]);
    assert!(keys.lines().any(|k| k == "lim2:{quota|198.18.1.0/24}"), "keys in the store: {keys}");
}

/// A flood at 9x starting wherever it likes: were a leaving slice's
/// whole count to leave the window at once, the busiest exact window
/// would get up to 1.25x of the limit through one host. At a phase drawn
/// for this run, one host stays
/// within the bench's 1.05x and three hosts within its 1.10x.
#[test]
fn a_flood_starting_at_any_phase_stays_within_the_bound_on_one_host_and_three() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flph");
    // A phase drawn for this run (printed, so a failure can be replayed).
    let phase = fleet_wall_ns() % SLICE_NS;
    let local = format!(
        "rate = 100000\nburst = 100000\n\n[[class]]\nname = \"quota\"\nprotocol = \"udp\"\nports = [{PORT}]\nlimit = 600\nwindow = \"6s\"\nslices = 12\n"
    );
    let flood = |nodes: &[Node], what: &str| {
        let times = schedule(900, 13, SLICE_NS, 300_000_000, phase);
        let got = run(nodes, &[Flow { src: CLIENT, times }], 20_261_202);
        let peak = busiest(&got[0].1, WINDOW_NS);
        println!(
            "9x through {what} from {:.3} s into a slice: busiest 6 s window {peak} ({:.3}x)",
            phase as f64 / 1e9,
            peak as f64 / 600.0
        );
        peak
    };
    let one = start_nodes("flph1", 1, &local, &[CLIENT], &tmp.0, |_| {});
    let peak1 = flood(&one, "one host");
    drop(one);
    let redis = Redis::unix(&tmp.0);
    let nodes = start_nodes("flph", 3, &policy(&[redis.url()], 600, 20), &[CLIENT], &tmp.0, |_| {});
    assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the nodes never all synced");
    let peak3 = flood(&nodes, "3 hosts");
    assert!((600..=630).contains(&peak1), "one host: busiest window {peak1} (limit 600, bound 1.05x)");
    assert!((600..=660).contains(&peak3), "three hosts: busiest window {peak3} (limit 600, bound 1.10x)");
}

/// `limiter fleet status` and `limiter prefix show` as an operator reads
/// them, and the one-line error of `fleet status` without `[fleet]`.
fn cli(node: &Node, args: &[&str]) -> std::process::Output {
    std::process::Command::new(limiter_tests::scenario::locate_bin("limiter").unwrap())
        .args(args)
        .arg("--socket")
        .arg(&node.socket)
        .output()
        .unwrap()
}

#[test]
fn the_fleet_and_a_prefix_are_shown_to_the_operator() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flu");
    let redis = Redis::unix(&tmp.0);
    let nodes = start_nodes("flu", 3, &policy(&[redis.url()], 60, 200), &[CLIENT], &tmp.0, |_| {});
    assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the nodes never all synced");
    let _ = run(&nodes, &[Flow { src: CLIENT, times: schedule(30, 2, SLICE_NS, 200_000_000, 25_000_000) }], 5);
    let o = cli(&nodes[1], &["fleet", "status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("node        n1") && text.contains("(Redis): up"), "{text}");
    assert!(text.contains("nodes seen  3 (n0, n1, n2)"), "{text}");
    let o = cli(&nodes[1], &["prefix", "show", CLIENT]);
    let text = String::from_utf8_lossy(&o.stdout);
    let row = text.lines().find(|l| l.starts_with("quota")).unwrap_or_default().to_owned();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..3], ["quota", "fleet", "60"], "{text}");
    let (local, fleet, left): (u64, u64, u64) =
        (cols[3].parse().unwrap(), cols[4].parse().unwrap(), cols[5].parse().unwrap());
    // 60 sent at 3x the allowance: the fleet holds the limit, this node a share.
    assert!(local + fleet >= 55 && local + fleet <= 66 && local < 60, "{text}");
    assert_eq!(left, 60u64.saturating_sub(local + fleet), "{text}");
    // Without [fleet]: one line, non-zero.
    let plain = TempDir::new("flp");
    let alone = start_nodes("flp", 1, "rate = 1000\nburst = 2000\n", &[], &plain.0, |_| {});
    let o = cli(&alone[0], &["fleet", "status"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.lines().count() == 1 && err.contains("no [fleet] section"), "{err}");
}

#[test]
fn the_same_test_passes_unchanged_on_a_three_master_redis_cluster() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flc");
    let mut cluster = Cluster::start("flcs");
    let nodes =
        start_nodes("flc", 3, &policy(&Cluster::urls(), 600, 20), &[CLIENT], &tmp.0, |net| cluster.join(&net.b));
    let f = Client::new(&nodes[0].socket).fleet_status().unwrap().unwrap();
    assert!(f.cluster, "{f:?}");
    nine_times(&nodes);
}

/// A client exactly at its rate (10/s, limit 60 per 6 s) is never refused.
/// Its packets sit mid-way between slice edges (the coarse clock the
/// program reads lags by up to a few ms; a packet stamped before an edge
/// it was sent after would make 61 in one window).
#[test]
fn a_client_exactly_at_its_rate_is_never_refused() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    // A client exactly at its rate has no slack: a packet its sender sent
    // late (the machine descheduled it) crosses into the next slice and
    // makes one too many there. Such a run did not send at the rate, so it
    // runs again, said, at most three times; a refusal in a run sent on
    // time fails at once.
    for attempt in 1..=3 {
        let tmp = TempDir::new("fle");
        let redis = Redis::unix(&tmp.0);
        let nodes = start_nodes("fle", 3, &policy(&[redis.url()], 60, 200), &[CLIENT], &tmp.0, |_| {});
        assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the nodes never all synced");
        let times = schedule(10, 13, SLICE_NS, 300_000_000, 50_000_000);
        let got = run(&nodes, &[Flow { src: CLIENT, times }], 7);
        let (sent, admitted) = &got[0];
        let late = limiter_tests::fleet::last_run_late_ns();
        println!(
            "at the rate through 3 nodes: sent {sent}, admitted {} (sender at most {} ms late)",
            admitted.len(),
            late / 1_000_000
        );
        if admitted.len() < *sent && late > limiter_tests::fleet::LATE_NS && attempt < 3 {
            println!("run {attempt} was not sent at the rate: again");
            continue;
        }
        assert_eq!(admitted.len(), *sent, "a client at its rate was refused");
        return;
    }
}

/// `redis-server` killed mid-run: the compliant client loses nothing, a
/// flooding prefix is still limited (each node on its own view: up to 3x
/// during the outage, printed), and once the store is back the sync
/// resumes with the same daemons.
#[test]
fn a_store_outage_refuses_nothing_and_the_sync_resumes_when_it_is_back() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flo");
    let mut redis = Redis::unix(&tmp.0);
    let nodes = start_nodes("flo", 3, &policy(&[redis.url()], 60, 200), &[CLIENT, CALM], &tmp.0, |_| {});
    let pids: Vec<u32> = nodes.iter().map(|n| n.daemon.0.id()).collect();
    assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the nodes never all synced");
    let calm = schedule(10, 15, SLICE_NS, 300_000_000, 50_000_000);
    let flood = schedule(90, 15, SLICE_NS, 300_000_000, 3_000_000);
    let start = calm[0];
    let socket = redis.socket.clone();
    let outage = thread::scope(|s| {
        let run = s.spawn(|| run(&nodes, &[Flow { src: CALM, times: calm }, Flow { src: CLIENT, times: flood }], 99));
        // Down from 4 s to 9 s into the run.
        thread::sleep(
            Duration::from_nanos(start.saturating_sub(limiter_tests::fleet::wall_ns())) + Duration::from_secs(4),
        );
        redis.kill();
        let down = eventually(Duration::from_secs(3), || {
            nodes.iter().all(|n| Client::new(&n.socket).fleet_status().ok().flatten().is_some_and(|f| !f.store_up))
        });
        thread::sleep(Duration::from_secs(4));
        redis.start();
        assert_eq!(redis.socket, socket);
        let got = run.join().unwrap();
        (down, got)
    });
    let (down, got) = outage;
    assert!(down, "no node noticed the store was down");
    let ((calm_sent, calm_got), (flood_sent, flood_got)) = (&got[0], &got[1]);
    let peak = busiest(flood_got, WINDOW_NS);
    println!(
        "outage of 5 s: compliant client sent {calm_sent}, admitted {}; flood sent {flood_sent}, admitted {}, busiest 6 s window {peak} ({:.2}x the limit of 60)",
        calm_got.len(),
        flood_got.len(),
        peak as f64 / 60.0
    );
    assert_eq!(calm_got.len(), *calm_sent, "the outage made the compliant client lose packets");
    assert!(peak <= 3 * 60 + 3 * 18, "enforcement stopped during the outage: {peak} in a window");
    assert!(flood_got.len() < flood_sent / 2, "the flood was hardly limited: {} of {flood_sent}", flood_got.len());
    // Back: every node syncs again, the same processes.
    assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the sync did not resume");
    for (n, pid) in nodes.iter().zip(pids) {
        assert_eq!(n.daemon.0.id(), pid);
        let f = Client::new(&n.socket).fleet_status().unwrap().unwrap();
        assert!(f.outages >= 1 && f.outage_secs_total > 0.0, "{f:?}");
        assert!(f.errors.total() > 0, "{f:?}");
    }
    let show = Client::new(&nodes[0].socket).prefix_show(host(CLIENT)).unwrap();
    assert_eq!(show.cidr.to_string(), "198.18.1.0/24");
    assert_eq!((show.windows[0].class.as_str(), show.windows[0].limit), ("quota", 60));
}

/// A window override with fleet scope counts its prefix across the fleet
/// like a class: a client at 3x its allowance through 3 nodes gets the
/// limit through (not 3 times it).
#[test]
fn a_fleet_scope_override_is_counted_across_the_fleet() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flv");
    let redis = Redis::unix(&tmp.0);
    let text = policy(&[redis.url()], 60, 200).replace(
        "\n[fleet]",
        "\n[[override]]\ncidr = \"198.18.3.0/24\"\nlimit = 60\nwindow = \"6s\"\nscope = \"fleet\"\n\n[fleet]",
    );
    let nodes = start_nodes("flv", 3, &text, &[OVR], &tmp.0, |_| {});
    assert!(eventually(Duration::from_secs(10), || synced(&nodes)), "the nodes never all synced");
    // To a port no class matches: the default class, under the override.
    let times = schedule(30, 6, SLICE_NS, 300_000_000, 25_000_000);
    let got = limiter_tests::fleet::run_to(&nodes, &[Flow { src: OVR, times }], 3, PORT + 7);
    let (sent, admitted) = &got[0];
    let peak = busiest(admitted, WINDOW_NS);
    println!("override at 3x through 3 nodes: sent {sent}, admitted {}, busiest 6 s window {peak}", admitted.len());
    assert!((60..=66).contains(&peak), "busiest window {peak} for a limit of 60 across the fleet");
    let show = Client::new(&nodes[0].socket).prefix_show(host(OVR)).unwrap();
    assert_eq!(show.windows[0].class, "override:198.18.3.0/24", "{show:?}");
}

/// `on_store_failure = "split"` with the store unreachable from the start:
/// each node admits `limit / nodes` on its own, so a client at 3x through
/// 3 nodes gets at most the limit through (bounded overshoot), where
/// `open` would let each node admit the whole limit.
#[test]
fn with_the_store_down_a_split_class_admits_limit_over_nodes_on_each_node() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("fls");
    let nobody = format!("redis+unix://{}/nobody.sock", tmp.0.display());
    let text =
        policy(&[nobody], 60, 200).replace("scope = \"fleet\"\n", "scope = \"fleet\"\non_store_failure = \"split\"\n");
    let nodes = start_nodes("fls", 3, &text, &[CLIENT], &tmp.0, |_| {});
    let down = eventually(Duration::from_secs(10), || {
        nodes.iter().all(|n| Client::new(&n.socket).fleet_status().ok().flatten().is_some_and(|f| !f.store_up))
    });
    assert!(down, "the nodes never noticed the store is unreachable");
    let times = schedule(30, 6, SLICE_NS, 300_000_000, 25_000_000);
    let got = run(&nodes, &[Flow { src: CLIENT, times }], 11);
    let (sent, admitted) = &got[0];
    let peak = busiest(admitted, WINDOW_NS);
    println!(
        "split, store down, 3x through 3 nodes: sent {sent}, admitted {}, busiest 6 s window {peak}",
        admitted.len()
    );
    // Open would let each node admit the whole 60 (180 in all).
    assert!(peak <= 60, "busiest window {peak} past 3 shares of 20");
    assert!(peak >= 50, "split admitted far less than its shares: {peak}");
}

/// A policy apply moves a running fleet sync to another store (the node
/// name and interval with it), starts the sync on a daemon that ran
/// without `[fleet]`, and stops it when `[fleet]` is gone, with no daemon
/// restarted.
#[test]
fn a_policy_apply_moves_starts_or_stops_the_sync() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("flr");
    let (dir_a, dir_b) = (tmp.0.join("a"), tmp.0.join("b"));
    for d in [&dir_a, &dir_b] {
        std::fs::create_dir_all(d).unwrap();
    }
    let (a, b) = (Redis::unix(&dir_a), Redis::unix(&dir_b));
    let mut nodes = start_nodes("flr", 2, &policy(&[a.url()], 60, 200), &[CLIENT], &tmp.0, |_| {});
    let without = "rate = 100000\nburst = 100000\n";
    nodes.extend(start_nodes("flx", 1, without, &[CLIENT], &tmp.0, |_| {}));
    assert!(Client::new(&nodes[2].socket).fleet_status().unwrap().is_none(), "n2 starts without [fleet]");
    let on = |n: &Node, store: &Redis| {
        Client::new(&n.socket).fleet_status().ok().flatten().is_some_and(|f| f.store_up && f.store == [store.url()])
    };
    assert!(eventually(Duration::from_secs(10), || nodes[..2].iter().all(|n| on(n, &a))), "never synced with a");

    // Every node gets the policy with store b, its own name and a 100 ms sync.
    for (i, n) in nodes.iter().enumerate() {
        let file = tmp.0.join(format!("moved-{i}.toml"));
        let text = policy(&[b.url()], 60, 100).replace("{node}", &format!("m{i}"));
        std::fs::write(&file, text).unwrap();
        let o = cli(n, &["policy", "apply", file.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let moved = |n: &Node| {
        Client::new(&n.socket).fleet_status().ok().flatten().is_some_and(|f| {
            f.store_up
                && f.store == [b.url()]
                && f.node.starts_with('m')
                && f.sync_interval_ms == 100
                && f.nodes_seen.len() == 3
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || nodes.iter().all(moved)),
        "not all on b: {:?}",
        nodes.iter().map(|n| Client::new(&n.socket).fleet_status().ok().flatten()).collect::<Vec<_>>()
    );
    // The client's counts now go to b.
    let _ = run(&nodes, &[Flow { src: CLIENT, times: schedule(30, 2, SLICE_NS, 200_000_000, 25_000_000) }], 9);
    let key = "lim2:{quota|198.18.1.0/24}";
    assert!(eventually(Duration::from_secs(5), || b
        .cli(&["--scan", "--pattern", "lim2:{*"])
        .lines()
        .any(|k| k == key)));
    println!("after the apply: {:?}", Client::new(&nodes[2].socket).fleet_status().unwrap());

    // Node 0 gets the same class without [fleet]: its sync stops, it
    // forgets the others' counts, and it no longer writes to the store.
    let _ = run(&nodes, &[Flow { src: CLIENT, times: schedule(30, 1, SLICE_NS, 200_000_000, 25_000_000) }], 11);
    let counts = |n: &Node| {
        let rows = Client::new(&n.socket).prefix_show(host(CLIENT)).unwrap().windows;
        rows.iter().find(|r| r.class == "quota").map(|r| (r.local, r.fleet)).unwrap()
    };
    assert!(eventually(Duration::from_secs(2), || counts(&nodes[0]).1 > 0), "n0 never saw the others' counts");
    let alone = tmp.0.join("alone.toml");
    let text = policy(&[b.url()], 60, 100);
    std::fs::write(&alone, &text[..text.find("[fleet]").unwrap()]).unwrap();
    let o = cli(&nodes[0], &["policy", "apply", alone.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut seen = String::new();
    limiter_tests::scenario::wait_for(
        &nodes[0].log.lock().unwrap(),
        "stopped (the policy has no [fleet] section)",
        Duration::from_secs(5),
        &mut seen,
    )
    .unwrap_or_else(|e| panic!("{e}: {seen}"));
    assert!(Client::new(&nodes[0].socket).fleet_status().unwrap().is_none(), "n0 still reports a sync");
    let (local, fleet) = counts(&nodes[0]);
    assert_eq!(fleet, 0, "n0 kept the others' counts ({local} local)");
    let beat = || b.cli(&["HGET", "lim:nodes", "m0"]);
    let before = beat();
    thread::sleep(Duration::from_millis(400));
    assert_eq!(beat(), before, "n0 still beats in the store");
    // A heartbeat is the node's clock and the store's (NODE_MS:STORE_MS).
    let stamps: Vec<Option<u64>> = beat().trim().split(':').map(|t| t.parse().ok()).collect();
    assert!(stamps.len() == 2 && stamps.iter().all(Option::is_some), "{before}");
    // And [fleet] back: it syncs again, with no restart.
    let o = cli(&nodes[0], &["policy", "apply", tmp.0.join("moved-0.toml").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(eventually(Duration::from_secs(10), || moved(&nodes[0])), "n0 never synced again");
    assert!(eventually(Duration::from_secs(2), || beat() != before), "n0 never beat again");
}
