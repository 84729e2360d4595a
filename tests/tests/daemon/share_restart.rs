//! Under libxdp's dispatcher, over time: a
//! neighbour loaded, unloaded and loaded again while a flood runs, and
//! the limiter killed, restarted over its pins and unloaded, each time
//! with what the interface holds read back from Debian's xdp-loader. On
//! a kernel without `freplace` (these development machines) there is no
//! dispatcher to share, and the tests say so and end; the guest tier
//! runs them on Debian's own kernels.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use limiter_common::{BucketState, maps};
use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, CONFORM_SRC, FLOOD_SRC, Guard, PORT, Pins, spawn_lines, wait_for},
    sharing::{FILTERED_SRC, LibxdpDir, XdpFilter, listed_id, loader_status},
};

fn bin() -> PathBuf {
    scenario::locate_bin("limiter").unwrap()
}

/// The limiter in `attach` mode at priority 20, rate 100/s and burst 100,
/// pinned in `pins` when given; returns once its component is listed, or
/// `None` where the kernel refuses the component (6.12 with Debian 12's
/// libxdp: a component that changes packet data in a slot that does not),
/// said in one line.
fn start(net: &VethPair, attach: &str, pins: Option<&Path>, tmp: &TempDir, socket: &Path) -> Option<Guard> {
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, "rate = 100\nburst = 100\n").unwrap();
    let errors = tmp.0.join("stderr");
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--attach", attach, "--priority", "20", "--metrics", "off"])
        .args(["--status-interval", "0", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap());
    if let Some(p) = pins {
        c.arg("--pin").arg("--pin-dir").arg(p);
    }
    let mut daemon = Guard(c.spawn().unwrap());
    let began = Instant::now();
    loop {
        if loader_status(net).contains("limiter_chain") && socket.exists() {
            return Some(daemon);
        }
        if daemon.0.try_wait().unwrap().is_some() {
            let err = std::fs::read_to_string(&errors).unwrap_or_default();
            assert!(err.contains("refuses a dispatcher component that changes packet data"), "{err}");
            println!("on this kernel: {}", err.trim());
            return None;
        }
        assert!(began.elapsed() < scenario::DAEMON_START, "neither joined nor refused:\n{}", loader_status(net));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether this kernel runs libxdp's dispatcher (xdp-filter, just loaded,
/// sits under one).
fn dispatcher_runs(net: &VethPair) -> bool {
    let status = loader_status(net);
    if status.contains("xdp_dispatcher") {
        return true;
    }
    println!("no libxdp dispatcher on this kernel (no freplace): xdp-filter attached alone\n{status}");
    false
}

fn flood_bucket(pins: &Path) -> BucketState {
    limiter_tests::kernel::pinned_bucket(pins, &limiter_tests::kernel::v4_key([198, 18, 1, 0], 24))
        .expect("the flood's /24 has a bucket")
}

/// Packets the data plane counted, all reasons.
fn counted(socket: &Path) -> u64 {
    let o = Command::new(bin()).args(["stats", "--json", "--socket"]).arg(socket).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    j["reasons"].as_array().unwrap().iter().filter_map(|r| r["packets"].as_u64()).sum()
}

/// `kill -9` and a restart over the pins leave one
/// limiter component, its buckets and counters kept; `limiter unload`
/// takes out only the limiter's component, and xdp-filter goes on.
#[test]
fn under_a_dispatcher_a_restart_keeps_one_component_and_unload_takes_only_ours() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let _libxdp = LibxdpDir::hold();
    let net = VethPair::new("shrs");
    for src in [FLOOD_SRC, FILTERED_SRC] {
        net.add_source(src);
    }
    let _filter = XdpFilter::load(&net);
    if !dispatcher_runs(&net) {
        return;
    }
    let filter_id = listed_id(&loader_status(&net), "xdpfilt_alw_all").unwrap();
    let tmp = TempDir::new("shrs");
    let pins = Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-shrs-{}", std::process::id())));
    let socket = scenario::unique_socket("shrs");
    let Some(mut daemon) = start(&net, "auto", Some(&pins.0), &tmp, &socket) else { return };
    let flood = scenario::delivered(&net, FLOOD_SRC, 300);
    assert!(flood < 300, "the flood was not limited: {flood}/300");
    let (bucket, packets) = (flood_bucket(&pins.0), counted(&socket));
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    // The dead daemon's socket: the new one's is waited for.
    let _ = std::fs::remove_file(&socket);
    let daemon = start(&net, "auto", Some(&pins.0), &tmp, &socket).expect("the component came back");
    let status = loader_status(&net);
    println!("after kill -9 and a restart over the pins:\n{status}");
    assert_eq!(status.matches("limiter_chain").count(), 1, "{status}");
    assert_eq!(listed_id(&status, "xdpfilt_alw_all"), Some(filter_id), "{status}");
    assert_eq!(flood_bucket(&pins.0), bucket, "the restart reset the flood's bucket");
    assert!(counted(&socket) >= packets, "the restart reset the counters");
    drop(daemon);
    // From another network namespace: refused whole, nothing removed.
    let o = Command::new(bin()).args(["unload", "--pin-dir"]).arg(&pins.0).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("another network namespace"), "{err}");
    assert!(pins.0.join(maps::BUCKETS).exists(), "a refused unload removed pins");
    // From the interface's own.
    let o = net.b.net_command(bin()).args(["unload", "--pin-dir"]).arg(&pins.0).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status = loader_status(&net);
    println!("after limiter unload:\n{status}");
    assert!(!status.contains("limiter_chain"), "{status}");
    assert_eq!(listed_id(&status, "xdpfilt_alw_all"), Some(filter_id), "unload touched xdp-filter:\n{status}");
    let deny = net.b.net_command("xdp-filter").args(["ip", "--mode", "src", FILTERED_SRC]).output().unwrap();
    assert!(deny.status.success(), "{}", String::from_utf8_lossy(&deny.stderr));
    assert_eq!(scenario::delivered(&net, FILTERED_SRC, 50), 0, "xdp-filter stopped filtering");
    assert_eq!(scenario::delivered(&net, FLOOD_SRC, 300), 300, "the limiter still limits after unload");
}

/// A flood of 2,000/s for 8 s against rate 100/s and
/// burst 100, while xdp-filter is loaded after the limiter, unloaded,
/// and loaded again: the flood gets no more than its allowance (each
/// change of the dispatcher carries the limiter's component, or the
/// daemon's watch puts it back within a second), a conforming source
/// loses nothing, and xdp-filter's deny holds while it is there.
#[test]
fn a_neighbour_loaded_and_unloaded_under_a_flood_never_opens_the_limiter() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let _libxdp = LibxdpDir::hold();
    let net = VethPair::new("shnb");
    for src in [FLOOD_SRC, CONFORM_SRC, FILTERED_SRC] {
        net.add_source(src);
    }
    // Whether this kernel runs a dispatcher at all, with xdp-filter alone.
    let probe = XdpFilter::load(&net);
    if !dispatcher_runs(&net) {
        return;
    }
    drop(probe);
    let tmp = TempDir::new("shnb");
    let Some(_daemon) = start(&net, "libxdp", None, &tmp, &scenario::unique_socket("shnb")) else { return };
    let netload = scenario::locate_bin("netload").unwrap();
    let mut recv = net.b.command(&netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), "10"]);
    let (mut recv, rx) = spawn_lines(recv).unwrap();
    wait_for(&rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    let dst = format!("{B_ADDR}:{PORT}");
    let send = |src: &str, pps: &str| {
        Guard(net.a.command(&netload).args(["send", src, &dst, pps, "8"]).stdout(Stdio::null()).spawn().unwrap())
    };
    let began = Instant::now();
    let (flood, calm) = (send(FLOOD_SRC, "2000"), send(CONFORM_SRC, "20"));
    let mut seen = Vec::new();
    std::thread::sleep(Duration::from_secs(1));
    let filter = XdpFilter::load(&net);
    seen.push(loader_status(&net));
    let deny = net.b.net_command("xdp-filter").args(["ip", "--mode", "src", FILTERED_SRC]).output().unwrap();
    assert!(deny.status.success(), "{}", String::from_utf8_lossy(&deny.stderr));
    let listed = net.a.command(&netload).args(["send", FILTERED_SRC, &dst, "20", "1"]).stdout(Stdio::null()).status();
    assert!(listed.unwrap().success());
    drop(filter);
    std::thread::sleep(Duration::from_millis(1500));
    seen.push(loader_status(&net));
    let again = XdpFilter::load(&net);
    seen.push(loader_status(&net));
    // The senders end on their own (8 s), then the receiver.
    for mut g in [flood, calm] {
        let _ = g.0.wait();
    }
    assert!(recv.0.wait().unwrap().success());
    let log: String = rx.iter().map(|l| l + "\n").collect();
    let got = |src: &str| scenario::field(&log, &format!("from {src}"), 2).unwrap_or(0);
    let secs = began.elapsed().as_secs_f64().min(8.0);
    // The flood's allowance over the run: its burst, then 100/s.
    let allowance = 100.0 + 100.0 * secs;
    println!(
        "a flood of 2000/s for {secs:.1} s while xdp-filter came, went and came again: {} delivered (allowance {allowance:.0}), a conforming source {} of about 160, xdp-filter's denied source {}/20",
        got(FLOOD_SRC),
        got(CONFORM_SRC),
        got(FILTERED_SRC)
    );
    for s in &seen {
        assert_eq!(s.matches("limiter_chain").count(), 1, "the limiter left the chain:\n{s}");
    }
    assert!(seen[0].contains("xdpfilt") && !seen[1].contains("xdpfilt") && seen[2].contains("xdpfilt"), "{seen:?}");
    #[expect(clippy::cast_precision_loss, reason = "counts of packets")]
    let flood = got(FLOOD_SRC) as f64;
    assert!(flood <= allowance * 1.1, "{flood} delivered of a flood allowed {allowance:.0}: the limiter was out");
    assert!(got(CONFORM_SRC) >= 150, "the conforming source lost packets: {}", got(CONFORM_SRC));
    assert_eq!(got(FILTERED_SRC), 0, "xdp-filter's deny did not hold");
    drop(again);
}
