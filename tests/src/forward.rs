//! The forwarder's test bed: a client namespace whose connections come
//! from 198.18.5.10 (and 2001:2::10), the daemon's namespace with a
//! forwarder listening on 198.18.0.2, and upstreams that decode the PROXY
//! v2 header. Used by `tests/forward.rs` and `tests/forward_streams.rs`.

use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, TcpListener, TcpStream},
    path::PathBuf,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use limiter::forward::proxy::{PP2_TYPE_LIMITER, Verdict, parse_v2};

use crate::{
    kernel::{TempDir, require_root},
    netns::{B_IF, NetNs, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

pub const CLIENT: &str = "198.18.5.10";
pub const FRONT: &str = "198.18.0.2";
pub const CLIENT6: &str = "2001:2::10";
pub const FRONT6: &str = "2001:2::2";

/// A client namespace whose connections come from 198.18.5.10, a daemon
/// namespace, and the daemon with `forwards` in its policy.
pub struct Setup {
    pub net: VethPair,
    pub daemon: Guard,
    pub log: std::sync::mpsc::Receiver<String>,
    pub socket: PathBuf,
    pub tmp: TempDir,
}

#[must_use]
pub fn setup(tag: &str, forwards: &str) -> Setup {
    setup_with(tag, forwards, |_| {})
}

/// [`setup`], with `pre` applied to the daemon's command.
#[must_use]
pub fn setup_with(tag: &str, forwards: &str, pre: impl FnOnce(&mut Command)) -> Setup {
    let text = format!(
        "rate = 100000\nburst = 100000\n\n[[class]]\nname = \"syn\"\nprotocol = \"tcp\"\nports = [8443]\nsyn = true\nrate = 20\nburst = 40\nmode = \"shadow\"\n\n{forwards}"
    );
    setup_policy(tag, &text, pre)
}

/// The test bed with `policy` as the daemon's whole policy file.
#[must_use]
pub fn setup_policy(tag: &str, policy_text: &str, pre: impl FnOnce(&mut Command)) -> Setup {
    require_root();
    scenario::raise_nofile();
    let net = VethPair::new(tag);
    net.add_source(CLIENT);
    net.a.ip(&format!("route replace 198.18.0.0/24 dev va src {CLIENT}"));
    net.a.ip(&format!("addr add {CLIENT6}/64 dev va nodad"));
    net.b.ip(&format!("addr add {FRONT6}/64 dev {B_IF} nodad"));
    let tmp = TempDir::new(tag);
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, policy_text).unwrap();
    let socket = unique_socket(tag);
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(&socket);
    pre(&mut c);
    let (daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&log, "listening on", Duration::from_secs(20), &mut seen).unwrap();
    Setup { net, daemon, log, socket, tmp }
}

#[must_use]
pub fn forward(port: u16, upstreams: &[u16], extra: &str) -> String {
    let ups: Vec<String> = upstreams.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    format!("[[forward]]\nname = \"front\"\nlisten = [\"{FRONT}:{port}\"]\nupstreams = [{}]\n{extra}\n", ups.join(", "))
}

/// One request through the forwarder from the client namespace.
#[must_use]
pub fn request(ns: &NetNs, port: u16, req: &str) -> String {
    let req = req.to_owned();
    ns.run_in(move || {
        let mut s = TcpStream::connect((FRONT, port)).expect("connect through the forwarder");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

/// Wait until something listens on 127.0.0.1:`port` in `ns`.
pub fn wait_listening(ns: &NetNs, port: u16) {
    assert!(ns.listens_on(port), "nothing listens on 127.0.0.1:{port}");
}

#[must_use]
pub fn status(s: &Setup) -> serde_json::Value {
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["status", "--json", "--socket"])
        .arg(&s.socket)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)))
}

/// An upstream in `ns` on `port` that reads the PROXY v2 header, then
/// echoes every byte back until the client's half-close, then closes its
/// side. Each connection's header source is sent on `sources`.
#[must_use]
pub fn echo_upstream(ns: &NetNs, port: u16, sources: std::sync::mpsc::Sender<String>) -> thread::JoinHandle<()> {
    echo_upstream_at(ns, std::net::SocketAddr::from(([127, 0, 0, 1], port)), 3, sources)
}

/// [`echo_upstream`] listening on `at`, for `count` connections.
#[must_use]
pub fn echo_upstream_at(
    ns: &NetNs,
    at: std::net::SocketAddr,
    count: usize,
    sources: std::sync::mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    ns.spawn_in(move || {
        let l = TcpListener::bind(at).unwrap();
        for c in l.incoming().take(count) {
            let mut c = c.unwrap();
            let sources = sources.clone();
            thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut buf = Vec::new();
                let mut chunk = vec![0u8; 64 << 10];
                let p = loop {
                    if let Some(p) = parse_v2(&buf) {
                        break p;
                    }
                    let n = c.read(&mut chunk).unwrap();
                    assert!(n > 0, "closed before a PROXY v2 header");
                    buf.extend_from_slice(&chunk[..n]);
                };
                let _ = sources.send(p.src.to_string());
                c.write_all(&buf[p.len..]).unwrap();
                loop {
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => c.write_all(&chunk[..n]).unwrap(),
                    }
                }
                c.shutdown(Shutdown::Write).unwrap();
            });
        }
    })
}

/// Send `len` pseudo-random bytes to `to` from the client namespace,
/// half-close, and read everything back: true when the echo is exact.
#[must_use]
pub fn echo_round_trip(ns: &NetNs, to: std::net::SocketAddr, len: usize) -> bool {
    let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0]).collect();
    ns.run_in(move || {
        let c = TcpStream::connect(to).expect("connect through the forwarder");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = c.try_clone().unwrap();
        let sent = data.clone();
        let writer = thread::spawn(move || {
            w.write_all(&sent).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut back = Vec::with_capacity(len);
        let _ = (&c).read_to_end(&mut back);
        writer.join().unwrap();
        back.len() == data.len() && back == data
    })
}

/// An upstream in `ns` on `port` that answers each connection with its
/// PROXY v2 header decoded (one JSON line), then holds it for `hold`, then
/// closes. Stops when `stop` is set.
#[must_use]
pub fn tlv_upstream(
    ns: &NetNs,
    port: u16,
    hold: Duration,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
) -> thread::JoinHandle<()> {
    ns.spawn_in(move || {
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        l.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((mut c, _)) = l.accept() else {
                thread::sleep(Duration::from_millis(5));
                continue;
            };
            served.fetch_add(1, Ordering::Relaxed);
            thread::spawn(move || {
                c.set_nonblocking(false).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut buf = Vec::new();
                let mut chunk = [0u8; 512];
                let parsed = loop {
                    if let Some(p) = parse_v2(&buf) {
                        break Some(p);
                    }
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => break None,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let line = match parsed {
                    Some(p) => {
                        let v = p.tlvs.iter().find(|t| t.0 == PP2_TYPE_LIMITER).and_then(|t| Verdict::decode(&t.1));
                        let v = v.unwrap_or_default();
                        serde_json::json!({
                            "src": p.src.to_string(), "dst": p.dst.to_string(), "version": v.policy_version,
                            "class": v.class, "shadow": v.shadow, "family": v.family, "prefix_len": v.prefix_len,
                            "prefix": std::net::Ipv4Addr::new(v.prefix[0], v.prefix[1], v.prefix[2], v.prefix[3]).to_string(),
                            "remaining": v.remaining, "port": port,
                        })
                        .to_string()
                    }
                    None => "no header".into(),
                };
                let _ = c.write_all(format!("{line}\n").as_bytes());
                thread::sleep(hold);
                let _ = c.shutdown(Shutdown::Both);
            });
        }
    })
}
