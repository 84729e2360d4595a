//! The daemon as a CrowdSec bouncer, against a real Local API (Debian's
//! `crowdsec` 1.4.6, extracted; run in the daemon's namespace): a decision
//! `cscli` adds reaches XDP within `update_frequency` + 1 s and drops
//! exactly what it names (an address, not its /24; an IPv6 address, not
//! its /64); a range too; a
//! deletion is lifted as fast; 10,000 imported decisions are applied
//! within 2 s of their pull; an operator's `allow` outranks a decision;
//! the LAPI killed leaves the decisions enforcing, says so on the scrape,
//! and its return is noticed; `cscli bouncers list` shows the bouncer's
//! last pull.

use std::{
    path::Path,
    process::Command,
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use limiter_tests::{
    crowdsec::Lapi,
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, FLOOD_SRC, Guard, delivered, metric, scrape, spawn_lines, unique_socket, wait_for},
};

/// A sender in the flood source's /24.
const NEIGHBOUR: &str = "198.18.1.11";
/// IPv6 senders in one /64 (the receiver is 2001:2::2).
const V6_BANNED: &str = "2001:2::10";
const V6_NEIGHBOUR: &str = "2001:2::11";

/// IPv6 on the veth: the receiver and two senders, without duplicate
/// address detection (so they are usable at once).
fn add_v6(net: &VethPair) {
    net.b.ip(&format!("addr add 2001:2::2/64 dev {B_IF} nodad"));
    for src in [V6_BANNED, V6_NEIGHBOUR] {
        net.a.ip(&format!("addr add {src}/128 dev va nodad"));
    }
    net.a.ip("route add 2001:2::/64 dev va");
}

/// Send `n` UDP packets from `src` to [2001:2::2]:9001 within a second;
/// how many arrived.
fn delivered6(net: &VethPair, src: &str, n: u64) -> u64 {
    let netload = env!("CARGO_BIN_EXE_netload");
    let mut recv = net.b.command(netload);
    recv.args(["recv", "[::]:9001", "2"]);
    let (mut recv, rx) = spawn_lines(recv).unwrap();
    wait_for(&rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    let mut send = net.a.command(netload);
    send.args(["send", src, "[2001:2::2]:9001", &n.to_string(), "1"]).stdout(std::process::Stdio::null());
    assert!(send.status().unwrap().success());
    assert!(recv.0.wait().unwrap().success());
    let log: String = rx.iter().map(|l| l + "\n").collect();
    scenario::field(&log, &format!("from {src}"), 2).unwrap_or(0)
}

/// Wait for `what` in the daemon's log; how long it took from `since`.
fn seen(rx: &Receiver<String>, what: &str, since: Instant, log: &mut String) -> Duration {
    wait_for(rx, what, Duration::from_secs(20), log).unwrap();
    since.elapsed()
}

/// `prefix list` names each of `cidrs` as a CrowdSec decision of `cscli`
/// with about an hour left.
fn assert_listed(socket: &Path, cidrs: &[String]) {
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["prefix", "list", "-j", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for cidr in cidrs {
        let e = list["overrides"].as_array().unwrap().iter().find(|e| e["cidr"] == cidr.as_str());
        let e = e.unwrap_or_else(|| panic!("{cidr} not in {list}"));
        let shown = (e["action"].as_str(), e["origin"].as_str(), e["source"].as_str());
        assert_eq!(shown, (Some("deny"), Some("crowdsec"), Some("crowdsec:cscli")), "{e}");
        assert!(e["expires_in_secs"].as_u64().is_some_and(|t| (3000..=3600).contains(&t)), "{e}");
    }
}

fn start(net: &VethPair, policy: &Path, socket: &Path) -> (Guard, Receiver<String>, String) {
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(policy).arg("--socket").arg(socket);
    let (g, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", Duration::from_secs(20), &mut log).unwrap();
    (g, rx, log)
}

#[test]
fn the_daemon_bounces_what_the_lapi_decides() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("cb");
    for src in [FLOOD_SRC, CONFORM_SRC, NEIGHBOUR] {
        net.add_source(src);
    }
    add_v6(&net);
    let mut lapi = Lapi::start_in("cb", Some(&net.b.name));
    let tmp = TempDir::new("bouncer");
    let (keyfile, file) = (tmp.0.join("key"), tmp.0.join("policy.toml"));
    std::fs::write(&keyfile, lapi.bouncer_key("limiter")).unwrap();
    std::fs::write(
        &file,
        format!(
            "rate = 100000\nburst = 100000\n\n[crowdsec]\nlapi_url = \"{}\"\napi_key_file = \"{}\"\nupdate_frequency = \"1s\"\nallow_bogons = true\n",
            lapi.url(),
            keyfile.display()
        ),
    )
    .unwrap();
    let socket = unique_socket("bouncer");
    let (_daemon, rx, mut log) = start(&net, &file, &socket);
    wait_for(&rx, "crowdsec: startup pull", Duration::from_secs(10), &mut log).unwrap();

    // An address: exactly it, within update_frequency + 1 s.
    let t = Instant::now();
    lapi.cscli(&["decisions", "add", "--ip", FLOOD_SRC, "--duration", "1h"]);
    let took = seen(&rx, "1 networks denied", t, &mut log);
    println!("a decision reached XDP {:.2} s after cscli returned", took.as_secs_f64());
    assert!(took <= Duration::from_secs(2), "{took:?}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 0);
    assert_eq!(delivered(&net, NEIGHBOUR, 50), 50, "the decision denied the address's /24");
    // An IPv6 address: exactly it, not its /64.
    assert_eq!(delivered6(&net, V6_BANNED, 50), 50, "IPv6 traffic does not flow at all");
    lapi.cscli(&["decisions", "add", "--ip", V6_BANNED, "--duration", "1h"]);
    wait_for(&rx, "1 networks denied", Duration::from_secs(5), &mut log).unwrap();
    assert_eq!(delivered6(&net, V6_BANNED, 50), 0);
    assert_eq!(delivered6(&net, V6_NEIGHBOUR, 50), 50, "the decision denied the address's /64");
    // A range.
    lapi.cscli(&["decisions", "add", "--range", "198.18.2.0/24", "--duration", "1h"]);
    wait_for(&rx, "1 networks denied", Duration::from_secs(5), &mut log).unwrap();
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 0);

    // `prefix list` shows each decision: origin and time left.
    let cidrs = [format!("{FLOOD_SRC}/32"), format!("{V6_BANNED}/128"), "198.18.2.0/24".to_owned()];
    assert_listed(&socket, &cidrs);

    // The operator outranks CrowdSec.
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["prefix", "allow", "198.18.2.0/24", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(delivered(&net, CONFORM_SRC, 50), 50, "a decision beat the operator's allow");

    // A deletion, as fast.
    let t = Instant::now();
    lapi.cscli(&["decisions", "delete", "--ip", FLOOD_SRC]);
    let took = seen(&rx, "1 lifted", t, &mut log);
    println!("a deletion was lifted {:.2} s after cscli returned", took.as_secs_f64());
    assert!(took <= Duration::from_secs(2), "{took:?}");
    assert_eq!(delivered(&net, FLOOD_SRC, 50), 50);

    // 10,000 imported decisions: applied within 2 s of the pull.
    let list: String = std::iter::once("duration,scope,value\n".to_owned())
        .chain((0..10_000u32).map(|i| format!("2h,ip,{}\n", std::net::Ipv4Addr::from(0x0b00_0000 + i))))
        .collect();
    let csv = tmp.0.join("decisions.csv");
    std::fs::write(&csv, list).unwrap();
    lapi.cscli(&["decisions", "import", "-i", &csv.display().to_string()]);
    // In force with the IPv6 address and the range: in the next pull (or
    // two, if one came while the LAPI wrote them, 50 at a time). A chunk
    // stamped before a pull and written after it is in no delta: the
    // next startup pull (every 60th, a minute at 1 s) brings it.
    let t = Instant::now();
    wait_for(&rx, "10002 in force", Duration::from_secs(90), &mut log).unwrap();
    let took = t.elapsed();
    let line = log.lines().rev().find(|l| l.contains("10002 in force")).unwrap().to_owned();
    println!("10,000 imported decisions applied {:.2} s after the import returned: {line}", took.as_secs_f64());
    if line.contains("delta pull") {
        assert!(took <= Duration::from_secs(3), "{took:?} (update_frequency 1 s + 2 s)");
    } else {
        println!("the LAPI's deltas lost some; the startup pull brought them");
        assert!(line.contains("startup pull"), "{line}");
    }

    // The LAPI killed: the decisions stay, the scrape says so.
    lapi.kill();
    wait_for(&rx, "the decisions in force stay", Duration::from_secs(5), &mut log).unwrap();
    let text = scrape(&net);
    assert_eq!(metric(&text, "limiter_crowdsec_lapi_up"), 0);
    let held: u64 = text
        .lines()
        .filter(|l| l.starts_with("limiter_deny_networks{origin=\"crowdsec:"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(held, 10_002, "the IPv6 address, the range and the 10,000 imported, by origin:\n{text}");
    assert_eq!(delivered(&net, NEIGHBOUR, 20), 20);
    let o = Command::new(scenario::locate_bin("limiter").unwrap()).args(["status", "--socket"]).arg(&socket).output();
    let status = String::from_utf8(o.unwrap().stdout).unwrap();
    assert!(status.contains("DOWN for") && status.contains("the decisions in force stay"), "{status}");
    assert!(status.contains("deny set        crowdsec:cscli"), "{status}");
    // Back: noticed, and the bouncer's pulls are on record.
    lapi.run();
    wait_for(&rx, "answers again", Duration::from_secs(70), &mut log).unwrap();
    assert_eq!(metric(&scrape(&net), "limiter_crowdsec_lapi_up"), 1);
    let bouncers = lapi.bouncers();
    let me = bouncers.as_array().unwrap().iter().find(|b| b["name"] == "limiter").expect("the bouncer is listed");
    println!("cscli bouncers list: {me}");
    assert!(me["last_pull"].as_str().is_some_and(|p| !p.is_empty() && !p.starts_with("0001")), "{me}");
}
