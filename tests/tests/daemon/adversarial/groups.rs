//! Group files under attack (hardening round 4), through the real
//! `limiter run` on a veth:
//!
//! - G1: a deny group's file replaced by `0.0.0.0/0,XX` and `::/0,XX`,
//!   then by a one-node MaxMind database that gives the whole Internet to
//!   its country: each version is refused with why, and the version in
//!   force stays (the group's own /24 still denied, every other address
//!   still served).
//! - L1: a refused version is not read again until the file changes.
//! - L4: a network of one group inside a wider one of another: the more
//!   specific decides (as docs/policy.md says), and `limiter prefix show`
//!   names the group and its network.
//! - G2: a 988-byte database whose tree never ends (a chain of 128 nodes)
//!   neither wedges the group (the good file put back is read once the
//!   walk hits its bound) nor the stop (SIGTERM ends the daemon at once).

use std::time::{Duration, Instant};

use limiter::groups::craft;
use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, delivered, metric, scrape, spawn_lines, unique_socket, wait_for},
};

const DENIED: &str = "198.18.50.7";
const SERVED: &str = "198.18.60.7";

fn start(net: &VethPair, policy: &std::path::Path, socket: &std::path::Path) -> (scenario::Guard, std::sync::mpsc::Receiver<String>) {
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(policy).arg("--socket").arg(socket);
    let (g, log) = spawn_lines(c).unwrap();
    wait_for(&log, "metrics on", Duration::from_secs(30), &mut String::new()).unwrap();
    (g, log)
}

/// Wait for a log line holding `what` (within `secs`): the lines seen.
fn logged(log: &std::sync::mpsc::Receiver<String>, what: &str, secs: u64) -> String {
    let mut seen = String::new();
    let found = wait_for(log, what, Duration::from_secs(secs), &mut seen);
    assert!(found.is_ok(), "no {what:?} within {secs} s:\n{seen}");
    seen
}

fn refused(net: &VethPair) -> u64 {
    metric(&scrape(net), "limiter_group_versions_total{group=\"xx\",result=\"refused\"}")
}

#[test]
fn a_group_file_can_neither_deny_the_internet_nor_wedge_the_daemon() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("adgr");
    net.add_source(DENIED);
    net.add_source(SERVED);
    let dir = TempDir::new("adgr");
    let csv = dir.0.join("xx.csv");
    std::fs::write(&csv, "198.18.50.0/24,XX\n").unwrap();
    let policy = dir.0.join("policy.toml");
    let text = format!(
        "[[group]]\nname = \"xx\"\npath = {:?}\ncountries = [\"XX\"]\naction = \"deny\"\nallow_bogons = true\n",
        csv.display().to_string()
    );
    std::fs::write(&policy, text).unwrap();
    let socket = unique_socket("adgr");
    let (daemon, log) = start(&net, &policy, &socket);
    logged(&log, "group xx: 1 networks", 15);
    assert_eq!(delivered(&net, DENIED, 20), 0, "the group's /24 is denied");
    assert_eq!(delivered(&net, SERVED, 20), 20);

    // The whole Internet, as a CSV and as a one-node database.
    for (name, bytes, says) in [
        ("the whole Internet as a CSV", b"0.0.0.0/0,XX\n::/0,XX\n".to_vec(), "wider than /6 (min_v4_prefix)"),
        ("a one-node database", craft::everything("XX"), "(min_v"),
    ] {
        let before = refused(&net);
        std::fs::write(&csv, &bytes).unwrap();
        let lines = logged(&log, says, 15);
        println!("{name}: {}", lines.lines().find(|l| l.contains(says)).unwrap_or_default());
        assert!(lines.contains("its last version stays"), "{lines}");
        assert_eq!(refused(&net), before + 1, "{name}");
        assert_eq!(delivered(&net, SERVED, 20), 20, "{name}: another address was denied");
        assert_eq!(delivered(&net, DENIED, 20), 0, "{name}: the version in force was lifted");
        // Not read again while it stands unchanged (it was every 2-3 s).
        std::thread::sleep(Duration::from_secs(6));
        assert_eq!(refused(&net), before + 1, "{name}: read again unchanged");
    }

    // A tree that never ends: the stop does not wait on its reader.
    std::fs::write(&csv, craft::chain(128)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let asked = Instant::now();
    drop(daemon);
    let stop = asked.elapsed();
    println!("stopped {stop:?} after SIGTERM, its reader walking a 988-byte endless tree");
    assert!(stop < Duration::from_secs(5), "the stop waited {stop:?}");

    // And the group is not wedged: the walk ends at one of its bounds (16
    // million records, or 60 s: the debug build the tests run walks the
    // records in about 40 s on an idle two-core machine, and meets the
    // time first on a busy one), refused, and the good file put back
    // after it is read.
    let (_daemon, log) = start(&net, &policy, &socket);
    let walked = Instant::now();
    let lines = logged(&log, "(a crafted file?)", 300);
    let bound = lines.lines().find(|l| l.contains("(a crafted file?)")).unwrap_or_default();
    assert!(
        bound.contains("whose tree holds more than 16000000 records") || bound.contains("whose tree was not read within 60 s"),
        "{bound}"
    );
    println!("the walk refused after {:?}: {bound}", walked.elapsed());
    std::fs::write(&csv, "198.18.50.0/24,XX\n198.18.52.0/24,XX\n").unwrap();
    logged(&log, "group xx: 2 networks", 20);
    println!("the good file read {:?} after the walk began", walked.elapsed());
    assert_eq!(delivered(&net, SERVED, 20), 20);
    assert_eq!(delivered(&net, DENIED, 20), 0);
}

/// A CSV's 198.18.71.0/24 denied inside a database's allowed
/// 198.18.0.0/16: the /24 is the deny group's, the rest of the /16 the
/// allow group's, and `prefix show` names each one's network (L4).
#[test]
fn the_most_specific_network_decides_and_prefix_show_names_it() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("adgs");
    let (inside, beside) = ("198.18.71.9", "198.18.72.9");
    net.add_source(inside);
    net.add_source(beside);
    let dir = TempDir::new("adgs");
    let (db, csv) = (dir.0.join("wide.mmdb"), dir.0.join("narrow.csv"));
    std::fs::write(&db, craft::one_v4("198.18.0.0/16".parse().unwrap(), "AA")).unwrap();
    std::fs::write(&csv, "198.18.71.0/24,BB\n").unwrap();
    let policy = dir.0.join("policy.toml");
    let group = |name: &str, path: &std::path::Path, code: &str, action: &str| {
        format!(
            "[[group]]\nname = \"{name}\"\npath = {:?}\ncountries = [\"{code}\"]\naction = \"{action}\"\nallow_bogons = true\n\n",
            path.display().to_string()
        )
    };
    std::fs::write(&policy, group("wide", &db, "AA", "allow") + &group("narrow", &csv, "BB", "deny")).unwrap();
    let socket = unique_socket("adgs");
    let (_daemon, log) = start(&net, &policy, &socket);
    // Both versions in force, in whichever order they were read.
    let first = logged(&log, "group wide: 1 networks", 15);
    if !first.contains("group narrow: 1 networks") {
        logged(&log, "group narrow: 1 networks", 15);
    }
    let show = |a: &str| String::from_utf8_lossy(&scenario::cli(&socket, &["prefix", "show", a]).stdout).into_owned();
    let (s_in, s_beside) = (show(inside), show(beside));
    println!("{s_in}\n{s_beside}");
    assert!(s_in.contains("group: narrow (its network 198.18.71.0/24"), "{s_in}");
    assert!(s_beside.contains("group: wide (its network 198.18.0.0/16"), "{s_beside}");
    assert_eq!(delivered(&net, inside, 20), 0, "the more specific deny decides");
    assert_eq!(delivered(&net, beside, 20), 20);
}
