//! Policy reload on SIGHUP during a real flood: a valid policy switches
//! atomically with a version bump, an invalid one is refused with its file,
//! line and field while the running version keeps enforcing, and the
//! conforming sender loses nothing throughout.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{thread, time::Duration};

use limiter_tests::{
    kernel::require_root,
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, Delivered, FLOOD_SRC, Guard, spawn_lines, wait_for},
};

fn hup(g: &Guard) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(g.0.id()).unwrap(), libc::SIGHUP) };
}

#[test]
fn reload_during_a_flood_is_atomic_and_a_bad_policy_changes_nothing() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = limiter_tests::kernel::TempDir::new("reload");
    let dir = &tmp.0;
    let file = dir.join("policy.toml");
    std::fs::write(&file, "# v1\nrate = 1000\nburst = 200\n").unwrap();

    let net = VethPair::new("rl");
    net.add_source(FLOOD_SRC);
    net.add_source(CONFORM_SRC);
    let netload = env!("CARGO_BIN_EXE_netload");
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&file);
    c.arg("--socket").arg(scenario::unique_socket("reload"));
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", Duration::from_secs(20), &mut log).unwrap();
    assert!(log.contains("policy v1: rate 1000"), "{log}");

    let traffic = scenario::start_traffic(&net, netload.as_ref(), 0, 400, 4.0).unwrap();

    thread::sleep(Duration::from_secs(1));
    std::fs::write(&file, "# v2\nrate = 2000\nburst = 200\n").unwrap();
    hup(&daemon);
    wait_for(&rx, "SIGHUP: applied", Duration::from_secs(5), &mut log).unwrap();
    assert!(log.contains("policy.toml: policy v2: rate 2000"), "{log}");

    thread::sleep(Duration::from_secs(1));
    std::fs::write(&file, "# v3, broken\nrate = \"fast\"\nburst = 200\n").unwrap();
    hup(&daemon);
    wait_for(&rx, "SIGHUP: rejected", Duration::from_secs(5), &mut log).unwrap();
    let rejected = log.lines().last().unwrap().to_owned();
    assert!(rejected.contains(&format!("{}:2: rate:", file.display())), "{rejected}");
    assert!(
        rejected.contains("policy v2 keeps running") && rejected.contains("event=\"reload\" ok=false"),
        "{rejected}"
    );

    let Delivered { flood_secs, flood_got, conform_sent, conform_got, .. } = traffic.finish().unwrap();
    let flood_got = flood_got as f64;
    drop(daemon);
    println!("flood got {flood_got} in {flood_secs:.3} s; conforming {conform_got}/{conform_sent}");

    // Never unprotected: at most what v2 allows over the whole flood.
    let upper = 200.0 + 2000.0 * flood_secs * 1.01 + 20.0;
    assert!(flood_got <= upper, "flood got {flood_got} > {upper:.0}");
    // And v2 really took over: more than v1 alone would have let through.
    let v1_only = 200.0 + 1000.0 * flood_secs * 1.01 + 10.0;
    assert!(flood_got > v1_only, "flood got {flood_got}: v2 never applied?");
    assert_eq!(conform_got, conform_sent, "conforming packets lost during reloads; links:\n{}", net.link_counters());
}

/// A SIGHUP with the file cut to `rate = 10` (or at a section boundary)
/// would lift the denies and cut the rate 100x: such a reload is refused with the numbers and the running
/// policy keeps enforcing; the file's `allow_shrink = true` lets it in.
#[test]
fn a_truncated_file_is_refused_on_reload_unless_it_says_so() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = limiter_tests::kernel::TempDir::new("reltr");
    let file = tmp.0.join("policy.toml");
    let full = "rate = 1000\nburst = 2000\n\n[[override]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n\n[[override]]\ncidr = \"198.18.3.0/24\"\naction = \"deny\"\n";
    std::fs::write(&file, full).unwrap();
    let net = VethPair::new("rtr");
    net.add_source(FLOOD_SRC);
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&file);
    c.arg("--socket").arg(scenario::unique_socket("reltr"));
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "attached", Duration::from_secs(20), &mut log).unwrap();
    assert_eq!(scenario::delivered(&net, FLOOD_SRC, 20), 0, "the deny is in force");
    // Cut short by an editor or a config push.
    std::fs::write(&file, "rate = 10\n").unwrap();
    hup(&daemon);
    wait_for(&rx, "SIGHUP: rejected", Duration::from_secs(5), &mut log).unwrap();
    let rejected = log.lines().last().unwrap().to_owned();
    assert!(
        rejected.contains("lifts 2 of the 2 overrides in force (2 of them denies)")
            && rejected.contains("cuts the default rate from 1000 to 10")
            && rejected.contains("policy v1 keeps running"),
        "{rejected}"
    );
    assert_eq!(scenario::delivered(&net, FLOOD_SRC, 20), 0, "the deny was lifted by a truncated file");
    // Meant: the file says so.
    std::fs::write(&file, "allow_shrink = true\nrate = 10\n").unwrap();
    hup(&daemon);
    wait_for(&rx, "SIGHUP: applied", Duration::from_secs(5), &mut log).unwrap();
    assert!(scenario::delivered(&net, FLOOD_SRC, 20) > 0, "the meant policy was not applied");
}
