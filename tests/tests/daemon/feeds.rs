//! Blocklist feeds through the daemon, over a real veth: a `[[feed]]`
//! file's networks are dropped at XDP and the rest of its /24 passes;
//! the file's next version moves only what changed; a version that reads
//! badly, or shrinks past `max_shrink`, is refused and the last one stays;
//! an operator's `allow` outranks the feed; the scrape counts networks and
//! drops by origin; and a restart keeps the set enforcing throughout.

use std::{
    path::{Path, PathBuf},
    sync::mpsc::Receiver,
    time::Duration,
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, FLOOD_SRC, Guard, delivered, metric, scrape, spawn_lines, unique_socket, wait_for},
};

/// A third sender in the flood source's /24.
const NEIGHBOUR: &str = "198.18.1.11";

/// Feed `t` (the test's addresses are in 198.18.0.0/15, benchmarking
/// space: it allows special-purpose ranges), and feed `b`, which does not.
fn policy(t: &Path, b: &Path) -> String {
    format!(
        "rate = 100000\nburst = 100000\n\n[[feed]]\nname = \"t\"\npath = \"{}\"\nrefresh = \"1h\"\nallow_bogons = true\n\n\
         [[feed]]\nname = \"b\"\npath = \"{}\"\n",
        t.display(),
        b.display()
    )
}

fn start(net: &VethPair, policy: &Path, socket: &Path, pins: &Path) -> (Guard, Receiver<String>, String) {
    // `nsenter`, not `ip netns exec`: the pins must outlive the process.
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--pin", "--policy"]).arg(policy);
    c.arg("--socket").arg(socket).arg("--pin-dir").arg(pins);
    let (g, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", scenario::DAEMON_START, &mut log).unwrap();
    (g, rx, log)
}

#[test]
fn a_feed_drops_its_networks_and_follows_its_file() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("feeds");
    let (feed, bogons, file) = (tmp.0.join("t.netset"), tmp.0.join("b.netset"), tmp.0.join("policy.toml"));
    let pins = scenario::Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-feeds-{}", std::process::id())));
    let pins = &pins.0;
    let socket = unique_socket("feeds");
    std::fs::write(&feed, format!("# a FireHOL-style list\n{FLOOD_SRC}\n203.0.113.7\n# end\n")).unwrap();
    std::fs::write(&bogons, format!("192.0.2.0/24\n{CONFORM_SRC}/32\n")).unwrap();
    std::fs::write(&file, policy(&feed, &bogons)).unwrap();
    let net = VethPair::new("fd");
    for src in [FLOOD_SRC, CONFORM_SRC, NEIGHBOUR] {
        net.add_source(src);
    }
    let (daemon, rx, mut log) = start(&net, &file, &socket, pins);
    // The two feeds are read side by side: their lines come in either order.
    for line in ["feed t: 2 networks", "feed b: 0 networks"] {
        if !log.contains(line) {
            wait_for(&rx, line, Duration::from_secs(10), &mut log).unwrap();
        }
    }
    // Feed b lists TEST-NET-1 and the conforming sender: special-purpose
    // space both, left out (its sender passes below).
    assert!(log.contains("feed b: 2 special-purpose network(s) left out"), "{log}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0, "the listed address passed");
    assert_eq!(delivered(&net, NEIGHBOUR, 50), 50, "its /24 neighbour was dropped");
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 50);
    let text = scrape(&net);
    assert_eq!(metric(&text, r#"limiter_deny_networks{origin="feed:t"}"#), 2);
    assert_eq!(metric(&text, r#"limiter_deny_dropped_packets_total{origin="feed:t"}"#), 50);

    // The next version: a range holding the conforming sender is added.
    std::fs::write(&feed, format!("{FLOOD_SRC}\n203.0.113.7\n198.18.2.0/24\n")).unwrap();
    wait_for(&rx, "feed t: 3 networks (was 2", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 0, "the new range passed");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0);

    // A version that does not read: refused, with its line; the last stays.
    std::fs::write(&feed, format!("{FLOOD_SRC}\nnot-an-address\n")).unwrap();
    wait_for(&rx, "line 2: \"not-an-address\" is not an address", Duration::from_secs(10), &mut log).unwrap();
    // A version cut short (1 of 3 left): refused.
    std::fs::write(&feed, format!("{FLOOD_SRC}\n")).unwrap();
    wait_for(&rx, "shrank by more than 50%", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 0, "a refused version lifted the range");
    let text = scrape(&net);
    assert_eq!(metric(&text, r#"limiter_feed_versions_total{feed="t",result="read_error"}"#), 1);
    assert_eq!(metric(&text, r#"limiter_feed_versions_total{feed="t",result="refused"}"#), 1);

    // The operator outranks the feed.
    let o = scenario::cli(&socket, &["prefix", "allow", "198.18.2.0/24"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 50, "an operator's allow lost to a feed");

    // A restart: the pinned program keeps dropping while the daemon is
    // down, and the new one reads the set back and keeps it.
    drop(daemon);
    drop(rx);
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0, "dropped with no daemon running");
    let (_daemon, rx, mut log) = start(&net, &file, &socket, pins);
    assert!(log.contains("the deny set's 3 networks read back from the pins"), "{log}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0);
    // The file is read again: the one-line version is this daemon's
    // first, and it is held to what the pins hold (3): refused as a
    // shrink (else a file truncated while the daemon was down would lift
    // the feed), the range still denied.
    wait_for(&rx, "shrank by more than 50%", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0);
    // A version within the guard is taken and lifts the range.
    std::fs::write(&feed, format!("{FLOOD_SRC}\n203.0.113.7\n")).unwrap();
    wait_for(&rx, "feed t: 2 networks (was 3", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0);
    let o = scenario::cli(&socket, &["prefix", "unset", "198.18.2.0/24"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 50);
}
