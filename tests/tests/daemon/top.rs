//! `limiter top` in a real terminal (tmux) during two floods: the stronger
//! flooding prefix is at the top, the weaker one next; and `--once -j`.

use std::{process::Command, process::Stdio, thread, time::Duration};

use limiter_tests::{
    kernel::require_root,
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, FLOOD_SRC, Guard, PORT, spawn_lines, unique_socket, wait_for},
};

const WEAK_SRC: &str = "198.18.3.10";

/// Kills the tmux session even when the test fails.
struct Tmux(String);

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.0]).status();
    }
}

#[test]
fn the_flooding_prefix_is_at_the_top() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("tp");
    net.add_source(FLOOD_SRC);
    net.add_source(WEAK_SRC);
    let socket = unique_socket("top");
    let bin = scenario::locate_bin("limiter").unwrap();
    let mut c = net.b.command(&bin);
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--rate", "1000", "--burst", "200", "--socket"])
        .arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();

    let netload = env!("CARGO_BIN_EXE_netload");
    let dst = format!("{B_ADDR}:{PORT}");
    let strong =
        net.a.command(netload).args(["send", FLOOD_SRC, &dst, "0", "5"]).stdout(Stdio::null()).spawn().unwrap();
    let weak =
        net.a.command(netload).args(["send", WEAK_SRC, &dst, "20000", "5"]).stdout(Stdio::null()).spawn().unwrap();
    let (_strong, _weak) = (Guard(strong), Guard(weak));
    thread::sleep(Duration::from_millis(1500));

    let session = Tmux(format!("limiter-top-{}", std::process::id()));
    let cmd = format!("{} top --interval 0.3 --socket {}", bin.display(), socket.display());
    let st = Command::new("tmux")
        .args(["new-session", "-d", "-s", &session.0, "-x", "140", "-y", "30", &cmd])
        .status()
        .unwrap();
    assert!(st.success(), "tmux new-session");
    thread::sleep(Duration::from_secs(2));
    let pane = Command::new("tmux").args(["capture-pane", "-p", "-t", &session.0]).output().unwrap();
    let screen = String::from_utf8_lossy(&pane.stdout).into_owned();
    let rows: Vec<&str> =
        screen.lines().skip_while(|l| !l.starts_with("prefix")).skip(1).filter(|l| !l.trim().is_empty()).collect();
    assert!(rows.first().is_some_and(|r| r.starts_with("198.18.1.0/24")), "screen:\n{screen}");
    assert!(rows.get(1).is_some_and(|r| r.starts_with("198.18.3.0/24")), "screen:\n{screen}");
    assert!(screen.lines().any(|l| l.starts_with("drop ") && l.contains('█')), "no drop sparkline:\n{screen}");

    let o = Command::new(&bin).args(["top", "--once", "-j", "--socket"]).arg(&socket).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let offenders = j["offenders"].as_array().unwrap();
    assert_eq!(offenders[0]["prefix"], "198.18.1.0/24", "{j}");
    assert_eq!(offenders[0]["class"], "default", "{j}");
    assert!(offenders[0]["drops_per_sec"].as_u64().unwrap() > offenders[1]["drops_per_sec"].as_u64().unwrap());
    assert!(j["dropped_per_sec"].as_array().unwrap().iter().any(|v| v.as_u64().unwrap() > 10_000), "{j}");
}

/// Shadow mode: what enforcing would drop is sampled and shown apart
/// (`top`'s shadow list, `explain`'s `shadow_drop`), while the packets
/// pass and nothing lists them as drops (link pressure reads those).
#[test]
fn shadow_mode_shows_what_it_would_drop_apart() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("ts");
    net.add_source(FLOOD_SRC);
    let socket = unique_socket("top-shadow");
    let bin = scenario::locate_bin("limiter").unwrap();
    let mut c = net.b.command(&bin);
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--shadow", "--rate", "1000", "--burst", "200"]);
    c.arg("--socket").arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let netload = env!("CARGO_BIN_EXE_netload");
    let dst = format!("{B_ADDR}:{PORT}");
    let flood =
        net.a.command(netload).args(["send", FLOOD_SRC, &dst, "0", "5"]).stdout(Stdio::null()).spawn().unwrap();
    let _flood = Guard(flood);
    thread::sleep(Duration::from_secs(2));

    let o = Command::new(&bin).args(["top", "--once", "-j", "--socket"]).arg(&socket).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["shadow"][0]["prefix"], "198.18.1.0/24", "{j}");
    assert!(j["shadow"][0]["drops_per_sec"].as_u64().unwrap() > 1_000, "{j}");
    assert_eq!(j["offenders"].as_array().map(Vec::len), Some(0), "shadow drops listed as drops: {j}");
    let o = Command::new(&bin).args(["top", "--once", "--socket"]).arg(&socket).output().unwrap();
    let screen = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = screen.lines().skip_while(|l| !l.starts_with("would drop (shadow)")).skip(1).collect();
    assert!(rows.first().is_some_and(|r| r.starts_with("198.18.1.0/24")), "{screen}");

    let o = Command::new(&bin).args(["explain", FLOOD_SRC, "-j", "--socket"]).arg(&socket).output().unwrap();
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Under the flood its bucket is all but empty (it refills at 1/ms
    // between packets): the verdict follows what is left, in shadow's
    // words.
    let bucket = e["layers"].as_array().unwrap().iter().find(|l| l["layer"] == "bucket").unwrap().clone();
    let tokens = bucket["detail"]["tokens"].as_u64().unwrap();
    assert!(tokens < 50, "{e}");
    let want = if tokens == 0 { ("shadow_drop", "shadow_dropped") } else { ("pass", "admitted") };
    assert_eq!((e["verdict"].as_str().unwrap(), e["reason"].as_str().unwrap()), want, "{e}");
    assert!(e["layers"][0]["says"].as_str().unwrap().ends_with(", shadow"), "{e}");
}

/// Two sources interleaved packet by packet at equal rates: each is seen
/// in proportion (the drop sample is drawn at random, not every Nth drop
/// of a counter, which sees one source only when the two alternate).
#[test]
fn interleaved_sources_are_both_seen_in_proportion() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("ti");
    let socket = unique_socket("top-interleaved");
    let bin = scenario::locate_bin("limiter").unwrap();
    let mut c = net.b.command(&bin);
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--rate", "1000", "--burst", "200", "--socket"])
        .arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let netload = env!("CARGO_BIN_EXE_netload");
    let dst = format!("{B_ADDR}:{PORT}");
    let (first, second) = ("198.18.31", "198.18.32");
    let nets = format!("{first},{second}");
    // On one CPU, as a single sender's packets are: a counter per CPU
    // would see them in their order.
    let mut flood = net.a.command("taskset");
    flood.args(["-c", "0", netload, "spoof-prefix", "va", &net.b_mac(), &dst, &nets, "8000", "6"]);
    flood.stdout(Stdio::null());
    let flood = flood.spawn().unwrap();
    let _flood = Guard(flood);
    thread::sleep(Duration::from_secs(5));

    let o = Command::new(&bin).args(["top", "--once", "-j", "--socket"]).arg(&socket).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rate = |p: &str| {
        let prefix = format!("{p}.0/24");
        j["offenders"].as_array().unwrap().iter().find(|o| o["prefix"] == prefix.as_str()).map_or(0, |o| {
            o["drops_per_sec"].as_u64().unwrap()
        })
    };
    let (ra, rb) = (rate(first), rate(second));
    // Each drops about 3,000/s (4,000/s sent, 1,000/s admitted): its
    // true share of the two is one half.
    eprintln!("interleaved: {first}.0/24 at {ra}/s, {second}.0/24 at {rb}/s");
    assert!(ra + rb > 2_000, "{j}");
    #[expect(clippy::cast_precision_loss, reason = "a share")]
    let share = ra as f64 / (ra + rb) as f64;
    assert!((0.375..=0.625).contains(&share), "{first}.0/24 at {ra}/s, {second}.0/24 at {rb}/s: {j}");
}
