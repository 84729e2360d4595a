//! The audit trail through the daemon: every change is recorded with who
//! made it (a control client by the uid and pid the kernel gives for its
//! socket; SIGHUP with the SHA-256 of the file it read; a feed by name),
//! refused requests too, in a history file of JSON lines that `limiter
//! history` reads back, across a restart.

use std::{path::Path, process::Command, sync::mpsc::Receiver, time::Duration};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

fn start(net: &VethPair, policy: &Path, socket: &Path, history: &Path) -> (Guard, Receiver<String>, String) {
    let mut cmd = net.b.command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(policy);
    cmd.arg("--socket").arg(socket).arg("--history").arg(history);
    let (g, rx) = spawn_lines(cmd).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", scenario::DAEMON_START, &mut log).unwrap();
    (g, rx, log)
}

/// `limiter history -j`'s records.
fn records(socket: &Path) -> Vec<serde_json::Value> {
    let o = scenario::cli(socket, &["history", "-j"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    h["records"].as_array().unwrap().clone()
}

fn find<'a>(records: &'a [serde_json::Value], change: &str) -> &'a serde_json::Value {
    records
        .iter()
        .find(|r| r["change"].as_str().is_some_and(|c| c.starts_with(change)))
        .unwrap_or_else(|| panic!("no record of {change:?}: {records:#?}"))
}

#[test]
fn every_change_is_recorded_with_who_made_it_and_read_back_after_a_restart() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("history");
    let (file, feed, history) = (tmp.0.join("policy.toml"), tmp.0.join("t.netset"), tmp.0.join("history.jsonl"));
    std::fs::write(&feed, "198.18.6.0/24\n").unwrap();
    let policy = |rate: u64| {
        format!(
            "rate = {rate}\nburst = 2000\n\n[[feed]]\nname = \"t\"\npath = \"{}\"\nallow_bogons = true\n",
            feed.display()
        )
    };
    std::fs::write(&file, policy(1000)).unwrap();
    let socket = unique_socket("history");
    let net = VethPair::new("hi");
    let (daemon, rx, mut log) = start(&net, &file, &socket, &history);
    if !log.contains("feed t: 1 networks") {
        wait_for(&rx, "feed t: 1 networks", Duration::from_secs(20), &mut log).unwrap();
    }

    // The operator's change, and a refused one: each by the client's uid
    // and pid, as the kernel gives them.
    let o = scenario::cli(&socket, &["prefix", "deny", "198.18.7.0/24", "--ttl", "60s", "--reason", "INC-4711: stuffing"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The reason is shown where the entry is.
    let o = scenario::cli(&socket, &["prefix", "list", "-j"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let entry = list["overrides"].as_array().unwrap().iter().find(|e| e["cidr"] == "198.18.7.0/24").cloned();
    assert_eq!(entry.map(|e| e["reason"].clone()), Some(serde_json::json!("INC-4711: stuffing")), "{list}");
    let o = scenario::cli(&socket, &["explain", "198.18.7.9"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("reason \"INC-4711: stuffing\""), "{o:?}");
    // A reason that would forge a line is refused at the command line.
    let o = scenario::cli(&socket, &["prefix", "deny", "198.18.8.0/24", "--reason", "a\nlimiter: audit: forged"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no control characters"), "{o:?}");
    let o = scenario::cli(&socket, &["prefix", "deny", "198.18.7.5/24"]);
    assert!(!o.status.success());
    // SIGHUP with a changed file: named with its SHA-256.
    std::fs::write(&file, policy(900)).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(daemon.0.id()).unwrap(), libc::SIGHUP) };
    wait_for(&rx, "SIGHUP: applied", Duration::from_secs(10), &mut log).unwrap();
    let sum = Command::new("sha256sum").arg(&file).output().unwrap();
    let sha = String::from_utf8_lossy(&sum.stdout).split_whitespace().next().unwrap().to_owned();

    wait_for(&rx, "limiter: audit: sighup: policy reload", Duration::from_secs(5), &mut log).unwrap();
    let all = records(&socket);
    let feed_version = find(&all, "a new version");
    assert_eq!((feed_version["by"].as_str(), feed_version["ok"].as_bool()), (Some("feed:t"), Some(true)));
    assert!(feed_version["result"].as_str().unwrap().contains("feed t: 1 networks"), "{feed_version}");
    let deny = find(&all, "prefix deny 198.18.7.0/24 ttl 60 reason \"INC-4711: stuffing\"");
    assert!(deny["by"].as_str().unwrap().starts_with("uid 0 pid "), "{deny}");
    assert_eq!(deny["ok"], true);
    let refused = find(&all, "prefix deny 198.18.7.5/24");
    assert_eq!(refused["ok"], false);
    assert!(refused["result"].as_str().unwrap().contains("host bits"), "{refused}");
    let reload = find(&all, "policy reload");
    assert_eq!(reload["by"], "sighup");
    assert!(reload["change"].as_str().unwrap().ends_with(&format!("sha256 {sha}")), "{reload} vs {sha}");


    // The file holds the same records, one JSON line each.
    // (written off the loop: give the writer a moment)
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&history).map_or(0, |t| t.lines().count()) < all.len()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&history).unwrap();
    let in_file: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(in_file, all);

    // The table for people, and --since.
    let o = scenario::cli(&socket, &["history", "--since", "1h"]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.lines().next().unwrap().starts_with("when"), "{table}");
    assert!(table.contains("REFUSED: ") && table.contains("prefix deny 198.18.7.0/24 ttl 60"), "{table}");

    // A bulk undo is one change, and --all asks for --yes.
    let o = scenario::cli(&socket, &["prefix", "unset", "--all"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--yes"), "{o:?}");
    let o = scenario::cli(&socket, &["prefix", "unset", "--origin", "runtime"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let undo = records(&socket);
    let undo = find(&undo, "prefix unset every entry of runtime");
    assert!(undo["result"].as_str().unwrap().starts_with("1 entries unset"), "{undo}");
    let o = scenario::cli(&socket, &["prefix", "list", "-j"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("198.18.7.0/24"), "the operator's entry stayed");

    // A restart reads the trail back.
    drop(daemon);
    drop(rx);
    let (_daemon, _rx, _log) = start(&net, &file, &socket, &history);
    let again = records(&socket);
    assert!(again.len() >= all.len(), "{again:#?}");
    assert_eq!(&again[..all.len()], &all[..], "the trail before the restart was not read back");
}
