//! `limiter explain` against a daemon holding every layer, over a real
//! veth: each answer names the layer that decides and what holds the
//! address there (an operator's deny with its time left, the file's
//! allow, a source's allow, a feed in the deny set, a deny group, a class
//! by port, a bucket a flood spent), and an address nothing holds is
//! said to have no state; what it says matches what the data plane does.

use std::{path::Path, time::Duration};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, FLOOD_SRC, delivered, spawn_lines, unique_socket, wait_for},
};

/// One packet a second, burst 5, per /24; a TLS class; the file allows
/// .4/24; a source allows .5/24; a feed denies .6/24; AS64502's group
/// (.8/24) is denied.
fn policy(dir: &Path) -> String {
    let (office, feed, csv) = (dir.join("office.txt"), dir.join("feed.netset"), dir.join("asn.csv"));
    std::fs::write(&office, "198.18.5.0/24\n").unwrap();
    std::fs::write(&feed, "198.18.6.0/24\n").unwrap();
    std::fs::write(&csv, "network,asn,name\n198.18.8.0/24,64502,Denied\n").unwrap();
    format!(
        "rate = 1\nburst = 5\n\n[[class]]\nname = \"tls\"\nprotocol = \"tcp\"\nports = [443]\nrate = 50\nburst = 100\n\n\
         [[override]]\ncidr = \"198.18.4.0/24\"\naction = \"allow\"\n\n\
         [[source]]\nname = \"office\"\nkind = \"plain\"\npath = \"{}\"\n\n\
         [[feed]]\nname = \"t\"\npath = \"{}\"\nallow_bogons = true\n\n\
         [[group]]\nname = \"as64502\"\npath = \"{}\"\nasns = [64502]\naction = \"deny\"\nallow_bogons = true\n",
        office.display(),
        feed.display(),
        csv.display()
    )
}

/// `limiter explain ARGS -j`.
fn explain(socket: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    all.push("-j");
    let o = scenario::cli(socket, &all);
    assert!(o.status.success(), "{all:?}: {} {}", String::from_utf8_lossy(&o.stderr), String::from_utf8_lossy(&o.stdout));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The layer called `name` of an answer.
fn layer<'a>(e: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    e["layers"].as_array().unwrap().iter().find(|l| l["layer"] == name).unwrap_or_else(|| panic!("no {name}: {e}"))
}

/// The verdict, its reason, the deciding layer, and what that layer says.
fn decided(e: &serde_json::Value) -> (String, String, String, String) {
    let by = e["decided_by"].as_str().unwrap().to_owned();
    let says = layer(e, &by)["says"].as_str().unwrap().to_owned();
    assert_eq!(layer(e, &by)["decides"], true, "{e}");
    let s = |k: &str| e[k].as_str().unwrap().to_owned();
    (s("verdict"), s("reason"), by, says)
}

#[test]
fn each_layer_that_holds_an_address_is_named_and_the_one_that_decides_marked() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("explain");
    let file = tmp.0.join("policy.toml");
    std::fs::write(&file, policy(&tmp.0)).unwrap();
    let socket = unique_socket("explain");
    let net = VethPair::new("ex");
    for src in [FLOOD_SRC, "198.18.5.10", "198.18.6.10", "198.18.8.10"] {
        net.add_source(src);
    }
    let mut cmd = net.b.command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&file).arg("--socket").arg(&socket);
    let (_daemon, rx) = spawn_lines(cmd).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", scenario::DAEMON_START, &mut log).unwrap();
    for line in ["feed t: 1 networks", "group as64502: "] {
        if !log.contains(line) {
            wait_for(&rx, line, Duration::from_secs(20), &mut log).unwrap();
        }
    }

    // Nothing holds it: said so, layer by layer; its bucket is not there yet.
    let e = explain(&socket, &["198.18.9.9"]);
    assert_eq!(decided(&e).0, "pass");
    assert_eq!(e["reason"], "admitted", "{e}");
    assert_eq!(e["cidr"], "198.18.9.0/24");
    for l in ["override", "deny_set", "bucket", "upstream"] {
        assert_eq!(layer(&e, l)["state"], false, "{l}: {e}");
    }
    assert!(layer(&e, "bucket")["says"].as_str().unwrap().contains("no bucket yet"), "{e}");
    assert!(layer(&e, "group")["says"].as_str().unwrap().contains("in no group"), "{e}");

    // Its class, by protocol and port.
    let e = explain(&socket, &["198.18.9.9", "--protocol", "tcp", "--port", "443"]);
    assert!(layer(&e, "class")["says"].as_str().unwrap().starts_with("class tls: 50/s, burst 100"), "{e}");
    assert_eq!(layer(&e, "class")["detail"]["name"], "tls");

    // The file's allow, a source's allow, a feed, a group.
    let (verdict, reason, by, says) = decided(&explain(&socket, &["198.18.4.7"]));
    assert_eq!((verdict.as_str(), reason.as_str(), by.as_str()), ("pass", "allowed", "override"));
    assert!(says.contains("198.18.4.0/24: allow by file"), "{says}");
    let (verdict, _, by, says) = decided(&explain(&socket, &["198.18.5.10"]));
    assert_eq!((verdict.as_str(), by.as_str()), ("pass", "override"));
    assert!(says.contains("by source:office"), "{says}");
    assert_eq!(delivered(&net, "198.18.5.10", 50), 50, "explain said pass, the data plane limited");
    let (verdict, reason, by, says) = decided(&explain(&socket, &["198.18.6.10"]));
    assert_eq!((verdict.as_str(), reason.as_str(), by.as_str()), ("drop", "denied", "deny_set"));
    assert!(says.contains("198.18.6.0/24 by feed:t"), "{says}");
    assert_eq!(delivered(&net, "198.18.6.10", 50), 0, "explain said drop, the data plane passed");
    let (verdict, _, by, says) = decided(&explain(&socket, &["198.18.8.10"]));
    assert_eq!((verdict.as_str(), by.as_str()), ("drop", "group"));
    assert!(says.starts_with("group as64502 (deny)"), "{says}");
    assert_eq!(delivered(&net, "198.18.8.10", 50), 0, "explain said drop, the data plane passed");

    // The operator's deny over the feed, with its time left: the feed's
    // entry is still listed beneath, not asked.
    let o = scenario::cli(&socket, &["prefix", "deny", "198.18.6.0/24", "--ttl", "1h"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = explain(&socket, &["198.18.6.10"]);
    let (_, _, by, says) = decided(&e);
    assert_eq!(by, "override");
    assert!(says.starts_with("198.18.6.0/24: deny by runtime, ends in "), "{says}");
    let left = layer(&e, "override")["detail"][0]["expires_in_secs"].as_u64().unwrap();
    assert!((3590..=3600).contains(&left), "{e}");
    assert_eq!(layer(&e, "deny_set")["decides"], false);
    assert_eq!(layer(&e, "deny_set")["state"], true);

    // A flood spends its bucket: what is left is read from the program's
    // bucket (it refills at 1/s while the answer is asked for), and the
    // bucket decides.
    assert!(delivered(&net, FLOOD_SRC, 50) < 20);
    let e = explain(&socket, &[FLOOD_SRC]);
    let (verdict, reason, by, says) = decided(&e);
    let tokens = layer(&e, "bucket")["detail"]["tokens"].as_u64().unwrap();
    assert!(tokens < 5, "a spent bucket read as {tokens} of 5: {e}");
    assert_eq!(by, "bucket");
    assert!(says.starts_with(&format!("{tokens} of 5 packets left, refilling at 1/s")), "{says}");
    let want = if tokens == 0 { ("drop", "rate_limited") } else { ("pass", "admitted") };
    assert_eq!((verdict.as_str(), reason.as_str()), want, "{e}");

    // The table for people: the verdict first, the deciding layer marked.
    let o = scenario::cli(&socket, &["explain", FLOOD_SRC]);
    let text = String::from_utf8_lossy(&o.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with(&format!("{FLOOD_SRC}: ")) && first.contains("decided by bucket"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("->") && l.contains("bucket")), "{text}");
}
