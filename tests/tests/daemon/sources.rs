//! `[[source]]` files through the daemon, over a real veth: a plain allow
//! list exempts its networks' buckets from a rate the rest is held to,
//! a plain deny list drops its own; the file's next version is taken,
//! one with a bad line or a network too wide is refused with why and the
//! last stays; the operator outranks a source; `prefix list` and the
//! scrape name it; and a restart applies the sources with its first
//! policy.

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

/// A sender in the flood source's /24, and one in a /24 no list names.
const NEIGHBOUR: &str = "198.18.1.11";
const UNLISTED: &str = "198.18.3.10";

/// One packet a second, a burst of 5, per /24; `office` allows, `blocked`
/// denies.
fn policy(office: &Path, blocked: &Path) -> String {
    format!(
        "rate = 1\nburst = 5\n\n[[source]]\nname = \"office\"\nkind = \"plain\"\npath = \"{}\"\n\n\
         [[source]]\nname = \"blocked\"\nkind = \"plain\"\naction = \"deny\"\npath = \"{}\"\n",
        office.display(),
        blocked.display()
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

fn cli(socket: &Path, args: &[&str]) -> serde_json::Value {
    let o = scenario::cli(socket, args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// `prefix list`'s entry of `cidr`: its origin and its source.
fn listed(socket: &Path, cidr: &str) -> Option<(String, String)> {
    let list = cli(socket, &["prefix", "list", "-j"]);
    let entries = list["overrides"].as_array().cloned().unwrap_or_default();
    let e = entries.into_iter().find(|e| e["cidr"] == cidr)?;
    Some((e["origin"].as_str().unwrap_or_default().to_owned(), e["source"].as_str().unwrap_or_default().to_owned()))
}

#[test]
fn a_source_allows_or_denies_its_networks_and_follows_its_file() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("sources");
    let (office, blocked, file) = (tmp.0.join("office.txt"), tmp.0.join("blocked.txt"), tmp.0.join("policy.toml"));
    let pins = scenario::Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-sources-{}", std::process::id())));
    let pins = &pins.0;
    let socket = unique_socket("sources");
    std::fs::write(&office, format!("# the office's address: its /24 is exempt\n{FLOOD_SRC}\n")).unwrap();
    std::fs::write(&blocked, "198.18.2.0/24\n").unwrap();
    std::fs::write(&file, policy(&office, &blocked)).unwrap();
    let net = VethPair::new("sr");
    for src in [FLOOD_SRC, CONFORM_SRC, NEIGHBOUR, UNLISTED] {
        net.add_source(src);
    }
    let (daemon, rx, mut log) = start(&net, &file, &socket, pins);
    assert!(log.contains("source office: 1 networks read at start"), "{log}");
    assert!(log.contains("source blocked: 1 networks read at start"), "{log}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 50, "the allowed address was limited");
    assert_eq!(delivered(&net, NEIGHBOUR, 50), 50, "an address counts for its bucket");
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 0, "the denied network passed");
    let limited = delivered(&net, UNLISTED, 50);
    assert!(limited < 20, "an unlisted sender passed {limited} of 50 at 1/s, burst 5");
    assert_eq!(listed(&socket, "198.18.1.0/24"), Some(("source".into(), "source:office".into())));
    assert_eq!(listed(&socket, "198.18.2.0/24"), Some(("source".into(), "source:blocked".into())));
    let text = scrape(&net);
    assert_eq!(metric(&text, r#"limiter_source_networks{source="office",kind="plain"}"#), 1);

    // The next version: the unlisted /24 is added.
    std::fs::write(&office, format!("{FLOOD_SRC}\n198.18.3.0/24\n")).unwrap();
    wait_for(&rx, "source office: 2 networks (allow)", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, UNLISTED, 50), 50, "the new version was not taken");
    assert_eq!(metric(&scrape(&net), r#"limiter_source_networks{source="office",kind="plain"}"#), 2);

    // A version with a line that is not a network, then one too wide:
    // each refused with why, the last stays.
    std::fs::write(&office, format!("{FLOOD_SRC}\n198.18.3.0/24\nallow 198.18.4.0/24;\n")).unwrap();
    wait_for(&rx, "line 3: \"allow 198.18.4.0/24;\" is not an address", Duration::from_secs(10), &mut log).unwrap();
    std::fs::write(&office, format!("{FLOOD_SRC}\n198.18.3.0/24\n0.0.0.0/0\n")).unwrap();
    wait_for(&rx, "0.0.0.0/0 is wider than a source may name", Duration::from_secs(10), &mut log).unwrap();
    assert_eq!(delivered(&net, UNLISTED, 50), 50, "a refused version lifted the last");
    let text = scrape(&net);
    let count = |result: &str| {
        metric(&text, &format!(r#"limiter_source_versions_total{{source="office",kind="plain",result="{result}"}}"#))
    };
    assert_eq!((count("read_error"), count("refused")), (1, 1), "{text}");

    // The operator outranks a source, and an unset gives it back.
    cli(&socket, &["prefix", "deny", "198.18.1.0/24"]);
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0, "a source's allow outranked the operator's deny");
    cli(&socket, &["prefix", "unset", "198.18.1.0/24"]);
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 50);

    // A restart: the pinned program keeps the sources' networks while
    // the daemon is down, and the new one applies them with its first
    // policy (read at start, not a tick later).
    std::fs::write(&office, format!("{FLOOD_SRC}\n198.18.3.0/24\n")).unwrap();
    drop(daemon);
    drop(rx);
    assert_eq!(delivered(&net, UNLISTED, 50), 50, "lifted with no daemon running");
    let (_daemon, _rx, log) = start(&net, &file, &socket, pins);
    assert!(log.contains("source office: 2 networks read at start"), "{log}");
    assert_eq!(delivered(&net, UNLISTED, 50), 50, "lifted by the restart");
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 0, "a deny lifted by the restart");
}
