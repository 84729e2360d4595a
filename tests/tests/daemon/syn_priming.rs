//! Trust boundaries, live over a veth pair: a flood of SYN+RST
//! from spoofed sources makes no bucket and spends no new-source budget,
//! so priming the sources with one first does not open a path for their
//! SYN flood into the kernel, and a new UDP source still gets in during it.
//! Were priming to make buckets, the primed flood would put over a
//! million SYNs into the kernel listener (against about 1,700 without
//! priming), and a new UDP prefix would get nothing in during a SYN+RST
//! flood.

use std::{process::Stdio, time::Duration};

use limiter::dataplane::AttachMode;
use limiter_common::programs;
use limiter_tests::{
    kernel::require_root,
    netns::{A_IF, B_ADDR, B_IF, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

const PORT: u16 = 8443;
const POLICY: &str = r#"
v4_prefix = 32

[[class]]
name = "app-syn"
protocol = "tcp"
ports = [8443]
syn = true
rate = 50
burst = 100
syn_cookies = "always"
"#;

fn stats(socket: &std::path::Path) -> serde_json::Value {
    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["stats", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap()
}

/// SYNs of the cookie class passed to the kernel so far.
fn syns_passed(socket: &std::path::Path) -> u64 {
    let s = stats(socket);
    let c = s["classes"].as_array().unwrap().iter().find(|c| c["class"] == "app-syn").cloned().unwrap();
    c["admitted"].as_u64().unwrap()
}

fn reason(socket: &std::path::Path, r: &str) -> u64 {
    let s = stats(socket);
    s["reasons"].as_array().unwrap().iter().find(|x| x["reason"] == r).and_then(|x| x["packets"].as_u64()).unwrap_or(0)
}

fn tracked(socket: &std::path::Path) -> u64 {
    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    j["tracked"].as_u64().unwrap()
}

fn spoof(net: &VethPair, mac: &str, secs: &str, flags: &str) -> String {
    let dst = format!("{B_ADDR}:{PORT}");
    let o = net
        .a
        .command(scenario::locate_bin("netload").unwrap())
        .args(["spoof-tcp", A_IF, mac, &dst, secs, flags])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn syn_rst_priming_opens_no_path_and_spends_no_budget() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("spr");
    let fresh = "198.18.3.10";
    net.add_source(fresh);
    for (ns, dev) in [(&net.a, A_IF), (&net.b, B_IF)] {
        let off = ns.command("sysctl").args(["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]).status();
        assert!(off.unwrap().success());
    }
    let sysctl = net.b.command("sysctl").args(["-qw", "net.ipv4.tcp_syncookies=2"]).status().unwrap();
    assert!(sysctl.success());
    // The generator drops the replies its spoofed sources draw.
    let mut generator = limiter::dataplane::DataPlane::open_bench(1024).unwrap();
    net.a.run_in(|| generator.attach_entry(programs::BENCH_DROP_FLOOD_REPLIES, A_IF, AttachMode::Native).unwrap());
    let dir = std::env::temp_dir().join(format!("limiter-spr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.toml"), POLICY).unwrap();
    let socket = unique_socket("spr");
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"])
        .arg(dir.join("policy.toml"))
        .arg("--socket")
        .arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let mac = net.b_mac();

    // The plain SYN flood: SYNs from sources without a bucket get cookies.
    let before = syns_passed(&socket);
    let out = spoof(&net, &mac, "2", "02");
    let plain = syns_passed(&socket) - before;
    // Priming: SYN+RST from every source, then the same SYN flood.
    let base = tracked(&socket);
    let primed_out = spoof(&net, &mac, "2", "06");
    std::thread::sleep(Duration::from_millis(2_500));
    let made = tracked(&socket).saturating_sub(base);
    let bad = reason(&socket, "tcp_bad_flags");
    let before = syns_passed(&socket);
    let out2 = spoof(&net, &mac, "2", "02");
    let primed = syns_passed(&socket) - before;
    println!(
        "plain flood ({}): {plain} SYNs into the kernel; SYN+RST priming ({}): {made} buckets, {bad} tcp_bad_flags; primed flood ({}): {primed} SYNs into the kernel",
        out.trim(),
        primed_out.trim(),
        out2.trim()
    );
    assert!(bad > 10_000, "the SYN+RST flood was not seen: {bad}");
    assert!(made <= 5, "SYN+RST made {made} buckets");
    assert!(primed <= 2 * plain.max(10), "priming let {primed} SYNs into the kernel against {plain} without it");

    // A new UDP source during a SYN+RST flood: its own allowance.
    let flood = Guard(
        net.a
            .command(scenario::locate_bin("netload").unwrap())
            .args(["spoof-tcp", A_IF, &mac, &format!("{B_ADDR}:{PORT}"), "3", "06"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let got = scenario::delivered(&net, fresh, 150);
    drop(flood);
    assert_eq!(got, 150, "a new UDP source got {got}/150 during the SYN+RST flood");
    let _ = std::fs::remove_dir_all(&dir);
}
