//! Forwarding at the driver: a client namespace (200 clients from 20
//! prefixes), the edge running the daemon with two `[[tunnel]]` services
//! (TCP 80 and UDP 53 on one service address), and two backends behind
//! it that decapsulate and answer the clients directly. Each backend's
//! servers say which backend they are and whom they saw: the clients'
//! own addresses, never the edge's. A flooding prefix reaches the
//! backends only within its allowance. A backend whose server stops
//! leaves the table within the health check's stated time; a drained one
//! keeps its open connections and gets no new ones.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, NetNs, VethPair},
    scenario::{self, spawn_lines, unique_socket, wait_for},
    tunnel::{Backend, VIP, sysctl},
};

/// Each client prefix's first address: 198.18.(10 + p).1.
fn client(p: u8, i: u8) -> String {
    format!("198.18.{}.{}", 10 + p, 1 + i)
}

const FLOODER: &str = "198.18.40.1";
/// The edge's allowance per /24 (packets a second, and burst).
const RATE: u64 = 1000;
const BURST: u64 = 2000;
const FLOOD_SECS: u64 = 2;

/// A backend's servers: HTTP-like on TCP 80 (one line answers each
/// request line, on keep-alive connections), echo on UDP 53; both answer
/// `backend N peer ADDR`. UDP packets are counted by source address.
struct Servers {
    tcp_stop: Arc<AtomicBool>,
    udp_stop: Arc<AtomicBool>,
    udp_seen: Arc<Mutex<HashMap<String, u64>>>,
}

fn serve_tcp(backend: &Backend) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let (n, flag) = (backend.n, stop.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    backend.ns.spawn_in(move || {
        let listener = TcpListener::bind("0.0.0.0:80").expect("bind 80");
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !flag.load(Ordering::Relaxed) {
            let Ok((c, peer)) = listener.accept() else {
                thread::sleep(Duration::from_millis(5));
                continue;
            };
            c.set_nonblocking(false).unwrap();
            thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut w = c;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|len| len > 0) {
                    let _ = writeln!(w, "backend {n} peer {}", peer.ip());
                    line.clear();
                }
            });
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("the TCP server started");
    stop
}

fn serve(backend: &Backend) -> Servers {
    let tcp_stop = serve_tcp(backend);
    let udp_stop = Arc::new(AtomicBool::new(false));
    let udp_seen = Arc::new(Mutex::new(HashMap::new()));
    let (n, flag, seen) = (backend.n, udp_stop.clone(), udp_seen.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    backend.ns.spawn_in(move || {
        // Bound to the service address: its answers leave from it.
        let u = UdpSocket::bind(format!("{VIP}:53")).expect("bind 53");
        u.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        while !flag.load(Ordering::Relaxed) {
            let Ok((_, peer)) = u.recv_from(&mut buf) else { continue };
            *seen.lock().unwrap().entry(peer.ip().to_string()).or_insert(0) += 1;
            let _ = u.send_to(format!("backend {n} peer {}", peer.ip()).as_bytes(), peer);
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("the UDP server started");
    Servers { tcp_stop, udp_stop, udp_seen }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.tcp_stop.store(true, Ordering::Relaxed);
        self.udp_stop.store(true, Ordering::Relaxed);
    }
}

/// One keep-alive connection from `src` to the service: its answers.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(src: &str) -> Option<Self> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
        s.bind(&format!("{src}:0").parse::<std::net::SocketAddr>().ok()?.into()).ok()?;
        s.connect_timeout(&format!("{VIP}:80").parse::<std::net::SocketAddr>().ok()?.into(), Duration::from_secs(3))
            .ok()?;
        let t: TcpStream = s.into();
        t.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        Some(Self(BufReader::new(t)))
    }

    /// Ask once: (backend, the peer it saw).
    fn ask(&mut self) -> Option<(u8, String)> {
        self.0.get_mut().write_all(b"GET / HTTP/1.1\r\n").ok()?;
        let mut line = String::new();
        self.0.read_line(&mut line).ok()?;
        let w: Vec<&str> = line.split_whitespace().collect();
        Some((w.get(1)?.parse().ok()?, (*w.get(3)?).to_owned()))
    }
}

fn backend_list(socket: &std::path::Path) -> serde_json::Value {
    let o = scenario::cli(socket, &["backend", "list", "--json"]);
    assert!(o.status.success(), "backend list: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

fn state_of(j: &serde_json::Value, tunnel: usize, addr: &str) -> String {
    j["tunnels"][tunnel]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == addr)
        .map(|b| b["state"].as_str().unwrap().to_owned())
        .unwrap()
}

/// New connections from 40 clients: how many each backend took.
fn spread(client: &NetNs) -> [usize; 2] {
    client.run_in(|| {
        let mut n = [0; 2];
        for p in 0..20 {
            for i in 2..4 {
                let (b, _) = Conn::open(&client_addr(p, i)).and_then(|mut c| c.ask()).expect("an answer");
                n[usize::from(b)] += 1;
            }
        }
        n
    })
}

fn client_addr(p: u8, i: u8) -> String {
    client(p, i)
}

#[test]
#[expect(clippy::too_many_lines, reason = "one test bed, its phases in order")]
fn admitted_packets_reach_the_backends_with_the_clients_addresses() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    scenario::raise_nofile();
    let net = VethPair::new("tun");
    let (c, edge) = (&net.a, &net.b);
    let mut out;
    sysctl(edge, &["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]);
    c.ip(&format!("route add {VIP}/32 via 198.18.0.2"));
    // The clients' segments carry whole checksums, as off the wire: a
    // veth leaves them to an offload that a frame the program forwards
    // never meets.
    out = c.command("ethtool").args(["-K", "va", "tx", "off"]).output().expect("ethtool runs");
    assert!(out.status.success(), "ethtool: {}", String::from_utf8_lossy(&out.stderr));
    for p in 0..20 {
        for i in 0..10 {
            net.add_source(&client(p, i));
        }
    }
    net.add_source(FLOODER);
    let backends = [Backend::new(edge, 0), Backend::new(edge, 1)];
    let servers: Vec<Servers> = backends.iter().map(serve).collect();
    let (b0, b1) = (backends[0].addr(), backends[1].addr());
    let health = "[tunnel.health]\nport = 80\ninterval = \"500ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 2\n";
    let policy = format!(
        "rate = {RATE}\nburst = {BURST}\n\n[[tunnel]]\nname = \"web\"\naddress = \"{VIP}\"\nprotocol = \"tcp\"\nports = \
         \"80\"\nsource = \"198.19.0.1\"\nbackends = [{{ address = \"{b0}\" }}, {{ address = \"{b1}\" }}]\n{health}\n[[tunnel]]\nname \
         = \"dns\"\naddress = \"{VIP}\"\nprotocol = \"udp\"\nports = \"53\"\nsource = \"198.19.0.1\"\nbackends = [{{ address = \
         \"{b0}\" }}, {{ address = \"{b1}\" }}]\n{health}"
    );
    let tmp = TempDir::new("tun");
    let path = tmp.0.join("policy.toml");
    std::fs::write(&path, &policy).unwrap();
    let socket = unique_socket("tun");
    let mut cmd = edge.net_command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"])
        .arg(&path)
        .arg("--socket")
        .arg(&socket);
    let (_daemon, log) = spawn_lines(cmd).unwrap();
    let mut seen = String::new();
    wait_for(&log, "control socket", Duration::from_secs(20), &mut seen).unwrap();
    let how = if backends[0].kernel { "the kernel's tunl0" } else { "a userspace decapsulator (no IPIP in this kernel)" };
    println!("backends decapsulate with {how}");

    // TCP: 200 clients, one connection each.
    let answers: Vec<(String, u8, String)> = c.run_in(|| {
        let mut out = Vec::new();
        for p in 0..20 {
            for i in 0..10 {
                let src = client(p, i);
                let (b, peer) = Conn::open(&src)
                    .and_then(|mut c| c.ask())
                    .unwrap_or_else(|| panic!("{src}: no answer; {}", backend_list(&socket)));
                out.push((src, b, peer));
            }
        }
        out
    });
    let wrong: Vec<_> = answers.iter().filter(|(src, _, peer)| src != peer).collect();
    let per: [usize; 2] = [0, 1].map(|n| answers.iter().filter(|a| a.1 == n).count());
    println!("200 TCP clients: backend 0 took {}, backend 1 took {}", per[0], per[1]);
    assert!(wrong.is_empty(), "backends saw other addresses than the clients': {wrong:?}");
    assert!(per.iter().all(|&n| n >= 60), "each backend takes a share of the flows: {per:?}");

    // UDP: a query from each prefix, answered directly from the service
    // address, with the client's address seen.
    let udp: Vec<String> = c.run_in(|| {
        (0..20)
            .map(|p| {
                let u = UdpSocket::bind(format!("{}:0", client(p, 0))).unwrap();
                u.connect(format!("{VIP}:53")).unwrap();
                u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                u.send(b"q").unwrap();
                let mut buf = [0u8; 128];
                let n = u.recv(&mut buf).expect("an answer from the service address");
                String::from_utf8_lossy(&buf[..n]).into_owned()
            })
            .collect()
    });
    for (p, a) in (0u8..).zip(&udp) {
        assert!(a.ends_with(&format!("peer {}", client(p, 0))), "{a}");
    }

    // A flood from one prefix: the backends get its allowance, no more.
    let sent = c.run_in(|| {
        let u = UdpSocket::bind(format!("{FLOODER}:0")).unwrap();
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_secs(FLOOD_SECS) {
            for _ in 0..64 {
                if u.send_to(b"flood", format!("{VIP}:53")).is_ok() {
                    n += 1;
                }
            }
        }
        n
    });
    thread::sleep(Duration::from_millis(300));
    let got: u64 = servers.iter().map(|s| s.udp_seen.lock().unwrap().get(FLOODER).copied().unwrap_or(0)).sum();
    let allowance = BURST + RATE * FLOOD_SECS;
    println!("flood: {sent} datagrams sent from {FLOODER}, the backends got {got} (allowance {allowance})");
    assert!(sent > 3 * allowance, "the flood was a flood ({sent})");
    assert!(got as f64 <= 1.1 * allowance as f64, "{got} reached the backends");
    assert!(got as f64 >= 0.5 * BURST as f64, "the allowance reached the backends ({got})");

    let j = backend_list(&socket);
    let forwarded: u64 = j["tunnels"].as_array().unwrap().iter().flat_map(|t| t["backends"].as_array().unwrap()).map(|b| b["packets"].as_u64().unwrap()).sum();
    println!("backend list: {j}");
    assert!(forwarded > 1000, "the program counts what it forwards: {forwarded}");
    for b in &backends {
        if let Some(d) = &b.decap {
            assert_eq!(d.bad.load(Ordering::Relaxed), 0, "outer headers with a wrong checksum, length or TTL");
            assert!(d.packets.load(Ordering::Relaxed) > 0);
        }
    }

    // Health: backend 1's TCP server stops; it leaves the web table
    // within fall x interval + timeout + a tick (2 x 0.5 + 0.2 + 1 s).
    servers[1].tcp_stop.store(true, Ordering::Relaxed);
    let start = Instant::now();
    while state_of(&backend_list(&socket), 0, &b1) != "down" {
        assert!(start.elapsed() < Duration::from_secs(6), "backend 1 never went down");
        thread::sleep(Duration::from_millis(100));
    }
    let took = start.elapsed();
    let n = spread(c);
    println!("backend 1's server stopped: down after {took:?}; 40 new connections: {n:?}");
    assert!(took < Duration::from_millis(3500), "{took:?}");
    assert_eq!(n[1], 0, "no new flow goes to a backend that is down");
    // Back: it rises again.
    let _again = serve_tcp(&backends[1]);
    let start = Instant::now();
    while state_of(&backend_list(&socket), 0, &b1) != "up" {
        assert!(start.elapsed() < Duration::from_secs(6), "backend 1 never came back");
        thread::sleep(Duration::from_millis(100));
    }

    // Drain: open connections stay on backend 1, new ones avoid it.
    let mut open: Vec<(Conn, u8)> = c.run_in(|| {
        (0..20)
            .map(|p| {
                let mut conn = Conn::open(&client(p, 5)).expect("connects");
                let (b, _) = conn.ask().expect("answers");
                (conn, b)
            })
            .collect()
    });
    let on1 = open.iter().filter(|(_, b)| *b == 1).count();
    out = scenario::cli(&socket, &["backend", "drain", &b1]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(state_of(&backend_list(&socket), 0, &b1), "drained");
    let kept = c.run_in(|| open.iter_mut().map(|(conn, b)| conn.ask().map(|a| a.0) == Some(*b)).filter(|k| *k).count());
    let n = spread(c);
    println!("drained backend 1 with {on1} of 20 open connections on it: {kept} of 20 kept their backend; 40 new: {n:?}");
    assert!(on1 > 0, "some connection was on backend 1");
    assert_eq!(kept, 20, "every open connection stays on its backend");
    assert_eq!(n[1], 0, "a drained backend gets no new flows");
    out = scenario::cli(&socket, &["backend", "undrain", &b1]);
    assert!(out.status.success());
    out = scenario::cli(&socket, &["backend", "drain", "198.19.9.9"]);
    assert!(!out.status.success(), "a backend no tunnel has is refused");
}
