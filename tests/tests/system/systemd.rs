//! The shipped systemd unit: valid, least privilege, reload by SIGHUP, and
//! its exact ExecStart works and reports READY=1 (Type=notify).

use std::{
    os::unix::net::UnixDatagram,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use limiter_tests::{
    kernel::require_root,
    netns::{B_IF, VethPair},
    scenario::{self, Guard, spawn_lines, wait_for},
};

fn unit() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/limiter@.service");
    std::fs::read_to_string(p).expect("packaging/limiter@.service")
}

fn value<'a>(unit: &'a str, key: &str) -> &'a str {
    unit.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("{key}= missing"))
}

#[test]
fn the_unit_asks_for_least_privilege_and_reloads_by_sighup() {
    let _alone = limiter_tests::alone(module_path!());
    let u = unit();
    assert_eq!(value(&u, "Type"), "notify");
    assert_eq!(value(&u, "CapabilityBoundingSet"), "CAP_BPF CAP_PERFMON CAP_NET_ADMIN");
    assert_eq!(value(&u, "AmbientCapabilities"), "CAP_BPF CAP_PERFMON CAP_NET_ADMIN");
    assert_eq!(value(&u, "NoNewPrivileges"), "yes");
    assert_eq!(value(&u, "ProtectSystem"), "strict");
    assert_eq!(value(&u, "ExecReload"), "/bin/kill -HUP $MAINPID");
    assert!(value(&u, "ExecStart").contains(" --pin "), "the service must pin");
}

/// The forwarding drop-in adds exactly CAP_NET_BIND_SERVICE to the unit.
#[test]
fn the_forwarding_drop_in_adds_only_the_bind_capability() {
    let _alone = limiter_tests::alone(module_path!());
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/forward.conf");
    let drop_in = std::fs::read_to_string(p).expect("packaging/forward.conf");
    let u = unit();
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        assert_eq!(value(&drop_in, key), format!("{} CAP_NET_BIND_SERVICE", value(&u, key)), "{key}");
    }
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let _alone = limiter_tests::alone(module_path!());
    let tmp = limiter_tests::kernel::TempDir::new("unit");
    let dir = &tmp.0;
    let bin = scenario::locate_bin("limiter").unwrap();
    let path = dir.join("limiter@lo.service");
    std::fs::write(&path, unit().replace("/usr/sbin/limiter", bin.to_str().unwrap())).unwrap();
    let o = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path).output().expect("systemd-analyze");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn exec_start_runs_as_written_and_notifies_ready() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("sd");
    let tag = format!("{}-sd", std::process::id());
    let exec = value(&unit(), "ExecStart")
        .replace("%i", B_IF)
        .replace("/sys/fs/bpf/limiter-vb", &format!("/sys/fs/bpf/limiter-test-{tag}"))
        .replace("/run/limiter/vb.sock", scenario::unique_socket("sd").to_str().unwrap())
        .replace("/var/lib/limiter/vb.history", std::env::temp_dir().join(format!("limiter-history-{tag}")).to_str().unwrap())
        .replace("/var/lib/limiter/vb.attacks", std::env::temp_dir().join(format!("limiter-attacks-{tag}")).to_str().unwrap());
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/sbin/limiter"));
    let args: Vec<&str> = words.collect();
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/limiter-test-{tag}"));

    let notify_path = std::env::temp_dir().join(format!("limiter-notify-{tag}"));
    let _ = std::fs::remove_file(&notify_path);
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(20))).unwrap();

    // Under the unit's capabilities only (root keeps its uid, as in the
    // unit) and NoNewPrivileges, through util-linux's setpriv: a program
    // the verifier refuses to a loader without CAP_PERFMON fails here.
    let caps: Vec<String> = value(&unit(), "CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let set = format!("-all,{}", caps.join(","));
    let mut c = net.b.net_command("setpriv");
    c.args(["--no-new-privs", "--bounding-set", &set, "--inh-caps", &set, "--ambient-caps", &set]);
    c.arg(scenario::locate_bin("limiter").unwrap());
    c.args(&args).env("NOTIFY_SOCKET", &notify_path).stderr(Stdio::inherit());
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut buf = [0u8; 64];
    let n = notify.recv(&mut buf).expect("READY=1 within 20 s");
    let mut log = String::new();
    wait_for(&rx, "control socket", Duration::from_secs(5), &mut log).unwrap();
    drop::<Guard>(daemon);
    let _ = limiter::dataplane::pin::unload(&pin_dir, false);
    let _ = std::fs::remove_file(&notify_path);
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("limiter-history-{tag}")));
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("limiter-attacks-{tag}")));
    assert_eq!(&buf[..n], b"READY=1\n");
    assert!(log.contains("pinned in"), "{log}");
}

/// The daemon under the unit's `RestrictAddressFamilies=` (a seccomp filter
/// equivalent to systemd's, since PID 1 here is not systemd) serves
/// `/metrics`; the filter is shown to bite by the families the unit had
/// before, under which the TCP listener cannot be made.
#[test]
fn under_the_units_address_families_metrics_are_served() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let unit = unit();
    let families = limiter_tests::seccomp::families(value(&unit, "RestrictAddressFamilies"));
    for (label, allowed, served) in [
        ("the unit's", families, true),
        ("AF_UNIX AF_NETLINK only", limiter_tests::seccomp::families("AF_UNIX AF_NETLINK"), false),
    ] {
        let net = VethPair::new("sdaf");
        let socket = scenario::unique_socket("sdaf");
        let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
        c.args(["run", "--iface", B_IF, "--status-interval", "0", "--socket"]).arg(&socket);
        limiter_tests::seccomp::restrict_address_families(&mut c, &allowed);
        let (daemon, rx) = spawn_lines(c).unwrap();
        let mut log = String::new();
        wait_for(&rx, "control socket", Duration::from_secs(20), &mut log).unwrap();
        let _ = wait_for(&rx, "metrics", Duration::from_secs(5), &mut log);
        if served {
            let o = net
                .b
                .command(env!("CARGO_BIN_EXE_netload"))
                .args(["get", "127.0.0.1:9464", "/metrics"])
                .output()
                .unwrap();
            let body = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success() && body.contains("limiter_attached"), "{label}: {log}\n{body}");
        } else {
            assert!(log.contains("metrics not served"), "{label}: the filter did not bite: {log}");
        }
        drop::<Guard>(daemon);
    }
}
