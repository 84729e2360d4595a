//! The daemon under test and the clients that attack it.

use super::*;

pub(super) struct Daemon {
    pub(super) guard: Guard,
    pub(super) log: Receiver<String>,
    pub(super) socket: PathBuf,
}

impl Daemon {
    pub(super) fn pid(&self) -> u32 {
        self.guard.0.id()
    }

    /// Lines logged so far (without waiting).
    pub(super) fn drain(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

pub(super) fn bin() -> PathBuf {
    scenario::locate_bin("limiter").unwrap()
}

/// `limiter run` in `ns` (its network only: pins stay visible) on `iface`.
pub(super) fn start_in(ns: &NetNs, iface: &str, tag: &str, extra: &[&str], pre: impl FnOnce(&mut Command)) -> Daemon {
    require_root();
    let socket = unique_socket(tag);
    let mut c = ns.net_command(bin());
    c.args(["run", "--iface", iface, "--status-interval", "0", "--socket"]).arg(&socket).args(extra);
    pre(&mut c);
    let (guard, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&log, "control socket", Duration::from_secs(20), &mut seen).unwrap();
    if !extra.contains(&"off") {
        // `/metrics` comes up just after the control socket.
        wait_for(&log, "metrics on", Duration::from_secs(5), &mut seen).unwrap();
    }
    Daemon { guard, log, socket }
}

pub(super) fn start(net: &VethPair, tag: &str, extra: &[&str]) -> Daemon {
    start_in(&net.b, B_IF, tag, extra, |_| {})
}

pub(super) fn cli(socket: &Path, args: &[&str]) -> Output {
    Command::new(bin()).args(args).arg("--socket").arg(socket).output().unwrap()
}

pub(super) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(super) fn status_json(d: &Daemon) -> serde_json::Value {
    let o = cli(&d.socket, &["status", "--json"]);
    assert!(o.status.success(), "status: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `GET path` on the daemon's `/metrics` port, from inside its namespace.
pub(super) fn http(net: &VethPair, request: &str) -> String {
    let request = request.to_owned();
    net.b.run_in(move || {
        let mut s = TcpStream::connect("127.0.0.1:9464").expect("connect to /metrics");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

pub(super) fn scrape(net: &VethPair) -> String {
    http(net, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

pub(super) fn vm_rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap()
}

/// Whether `r` reads end-of-stream (or an error line, then the end)
/// within `t`.
pub(super) fn closed_within(r: &mut impl std::io::Read, t: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < t {
        match r.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}
