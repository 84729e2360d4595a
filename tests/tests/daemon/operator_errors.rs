//! What a careless operator runs into: each mistake gets a message that
//! says what is wrong, and none leaves state behind or claims protection
//! that is not there.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::{Command, Output},
    time::Duration,
};

use limiter_tests::{
    kernel::require_root,
    netns::{B_IF, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

fn bin() -> PathBuf {
    scenario::locate_bin("limiter").unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct Pins(PathBuf);
impl Drop for Pins {
    fn drop(&mut self) {
        let _ = limiter::dataplane::pin::unload(&self.0, false);
    }
}

fn pin_dir(tag: &str) -> Pins {
    Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-{tag}-{}", std::process::id())))
}

/// An interface that already holds an XDP program is said to,
/// not blamed on the driver.
#[test]
fn an_interface_with_a_program_is_reported_as_busy() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("opbz");
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--metrics", "off", "--status-interval", "0", "--socket"])
        .arg(unique_socket("opbz1"));
    let (first, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let o = net
        .b
        .net_command(bin())
        .args(["run", "--iface", B_IF, "--metrics", "off", "--socket"])
        .arg(unique_socket("opbz2"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("vb already has an XDP program attached"), "{err}");
    assert!(!err.contains("driver may not support"), "{err}");
    // With --pin the same failure leaves nothing pinned (not 17 pins and
    // 132 MB of maps protecting nothing).
    let pins = pin_dir("opbz");
    let o = net
        .b
        .net_command(bin())
        .args(["run", "--iface", B_IF, "--metrics", "off", "--pin", "--pin-dir"])
        .arg(&pins.0)
        .arg("--socket")
        .arg(unique_socket("opbz3"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("vb already has an XDP program attached"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&pins.0)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a failed start left pins: {left:?}");
    drop::<Guard>(first);
}

/// A missing interface with `--pin` is refused before anything is
/// pinned.
#[test]
fn a_missing_interface_leaves_nothing_pinned() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let pins = pin_dir("opmi");
    let o = Command::new(bin())
        .args(["run", "--iface", "nosuch0", "--pin", "--pin-dir"])
        .arg(&pins.0)
        .args(["--metrics", "off", "--socket"])
        .arg(unique_socket("opmi"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("interface nosuch0 does not exist"), "{}", stderr(&o));
    let left: Vec<_> =
        std::fs::read_dir(&pins.0).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "pinned anyway: {left:?}");
}

/// Started under `ip netns exec` (a mount namespace of its own,
/// where /sys/fs/bpf is not mounted), `run --pin` refuses instead of
/// pinning where pins vanish with it, and `unload` says why it cannot see
/// the pins instead of "nothing pinned".
#[test]
fn a_private_mount_namespace_is_refused_for_pins() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("opns");
    let pins = pin_dir("opns");
    let o = net
        .b
        .command(bin())
        .args(["run", "--iface", B_IF, "--pin", "--pin-dir"])
        .arg(&pins.0)
        .args(["--metrics", "off", "--socket"])
        .arg(unique_socket("opns"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("mount namespace") && err.contains("nsenter"), "{err}");
    let xdp = net.b.command("ip").args(["-d", "link", "show", "dev", B_IF]).output().unwrap();
    assert!(!String::from_utf8_lossy(&xdp.stdout).contains("prog/xdp"), "attached anyway");
    let o = net.b.command(bin()).args(["unload", "--pin-dir"]).arg(&pins.0).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("mount namespace") && !err.contains("nothing pinned"), "{err}");
}

/// A runtime override that the restarted daemon's policy cannot
/// hold (finer than its buckets) is set aside with a warning, instead of
/// keeping the daemon from starting (a restart loop under systemd); a
/// `prefix deny --upstream` the policy cannot announce changes nothing.
#[test]
fn an_unfit_runtime_override_does_not_block_a_restart() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("oprt");
    let pins = pin_dir("oprt");
    let socket = unique_socket("oprt");
    let run = |extra: &[&str]| {
        let mut c = net.b.net_command(bin());
        c.args(["run", "--iface", B_IF, "--metrics", "off", "--status-interval", "0", "--pin", "--pin-dir"])
            .arg(&pins.0)
            .arg("--socket")
            .arg(&socket)
            .args(extra);
        spawn_lines(c).unwrap()
    };
    let (first, rx) = run(&[]);
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    let o = Command::new(bin()).args(["prefix", "deny", "198.18.5.0/24", "--socket"]).arg(&socket).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // `--upstream` with no `[upstream]` to announce it: one change,
    // refused whole (not denied here either), in one line.
    let o = Command::new(bin())
        .args(["prefix", "deny", "198.18.6.0/24", "--upstream", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let e = stderr(&o);
    assert!(!o.status.success() && e.contains("no [upstream] section") && e.contains("nothing changed"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    drop::<Guard>(first);
    let (second, rx) = run(&["--v4-prefix", "16"]);
    let mut log = String::new();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut log)
        .unwrap_or_else(|e| panic!("the restart failed: {e}: {log}"));
    assert!(log.contains("set aside the runtime override of 198.18.5.0/24"), "{log}");
    drop::<Guard>(second);
    // Set aside, not lost (the restart with /16 keeps it in the pinned
    // record): back with /24 buckets.
    let (third, rx) = run(&[]);
    let mut log = String::new();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut log).unwrap();
    assert!(log.contains("1 runtime override(s) put back"), "{log}");
    let o = Command::new(bin()).args(["prefix", "list", "--json", "--socket"]).arg(&socket).output().unwrap();
    let list = String::from_utf8_lossy(&o.stdout);
    assert!(list.contains("198.18.5.0/24") && list.contains("deny"), "{list}");
    assert!(!list.contains("198.18.6.0/24"), "refused, yet denied: {list}");
    drop::<Guard>(third);
}

/// `/metrics` answers only GET (and HEAD); POST and DELETE get 405.
#[test]
fn metrics_refuse_methods_other_than_get() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("opmt");
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--socket"]).arg(unique_socket("opmt"));
    let (daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "metrics on", Duration::from_secs(20), &mut String::new()).unwrap();
    for (method, code) in [("POST", "405"), ("DELETE", "405"), ("GET", "200"), ("HEAD", "200")] {
        let status = net.b.run_in(|| {
            let mut s = TcpStream::connect("127.0.0.1:9464").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(s, "{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out.lines().next().unwrap_or_default().to_owned()
        });
        assert!(status.contains(code), "{method}: {status}");
    }
    drop::<Guard>(daemon);
}

/// The CLI's inputs: `policy apply /dev/zero` and `prefix load --deny
/// /dev/zero` must not grow the client without bound, nor `policy apply
/// FIFO` block forever. The client applies the daemon's checks (a regular file, a size cap)
/// before it reads anything: one line, non-zero, at once.
#[test]
fn the_cli_reads_no_device_no_fifo_and_no_oversized_file() {
    let _alone = limiter_tests::alone(module_path!());
    let dir = std::env::temp_dir().join(format!("limiter-cli-in-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = dir.join("big.toml");
    std::fs::File::create(&big).unwrap().set_len(33 << 20).unwrap();
    let socket = dir.join("no-daemon.sock");
    let cases: [(&[&str], &str); 5] = [
        (&["policy", "apply", "/dev/zero"], "not a regular file"),
        (&["policy", "apply", fifo.to_str().unwrap()], "not a regular file"),
        (&["policy", "apply", big.to_str().unwrap()], "more than the"),
        (&["prefix", "load", "--deny", "/dev/zero"], "not a regular file"),
        (&["prefix", "load", "--deny", fifo.to_str().unwrap()], "not a regular file"),
    ];
    for (args, want) in cases {
        let start = std::time::Instant::now();
        let mut child = Command::new(bin())
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let guard_deadline = start + Duration::from_secs(5);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > guard_deadline {
                let _ = child.kill();
                panic!("limiter {args:?} still runs after 5 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!status.success(), "limiter {args:?} succeeded");
        assert!(err.lines().count() == 1 && err.contains(want), "limiter {args:?}: {err}");
        assert!(start.elapsed() < Duration::from_secs(2), "limiter {args:?} took {:?}", start.elapsed());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
