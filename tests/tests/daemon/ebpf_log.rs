//! The XDP program's own log lines (aya-log): only at debug level, and
//! rate-limited to one a second per CPU however hard the flood.

use std::time::Duration;

use limiter_tests::{
    kernel::require_root,
    netns::{B_IF, VethPair},
    scenario::{self, FLOOD_SRC, spawn_lines, unique_socket, wait_for},
};

/// Flood for 3 s against a daemon run with `rust_log`; count the program's
/// sampled-drop lines in its output.
fn sampled_drop_lines(tag: &str, rust_log: &str) -> usize {
    let net = VethPair::new(tag);
    net.add_source(FLOOD_SRC);
    net.add_source(scenario::CONFORM_SRC);
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--rate", "10", "--burst", "10"]);
    c.arg("--socket").arg(unique_socket(tag)).env("RUST_LOG", rust_log);
    let (daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let traffic = scenario::start_traffic(&net, env!("CARGO_BIN_EXE_netload").as_ref(), 0, 5, 3.0).unwrap();
    let d = traffic.finish().unwrap();
    assert!(d.flood_sent > 100_000, "flood too weak: {}", d.flood_sent);
    std::thread::sleep(Duration::from_millis(500)); // one more drain of the log ring
    drop(daemon);
    rx.iter().filter(|l| l.contains("sampled drop: family 4 /24")).count()
}

#[test]
fn ebpf_debug_lines_only_at_debug_level_and_rate_limited() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let lines = sampled_drop_lines("ld", "debug");
    // 3 s of flood on at most 2 CPUs: between 1 and (3 + 1) x 2 lines.
    assert!((1..=8).contains(&lines), "{lines} lines at debug level");
    assert_eq!(sampled_drop_lines("li", "info"), 0, "debug lines at info level");
}
