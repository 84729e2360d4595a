//! Forwarding at the driver: a client namespace (200 clients from 20
//! prefixes), the edge running the daemon with three `[[tunnel]]` services
//! (TCP 80 over IPIP, UDP 53 over GUE and UDP 54 over FOU on one service
//! address), and two backends behind
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
    netns::NetNs,
    scenario,
    tunnel::{Backend, FOU_PORT, GUE_PORT, VIP, VIP6, backend_list, daemon, edge, pinned_daemon},
};

/// The module's tests one at a time: each builds four namespaces and
/// loads the program, which under emulation takes tens of seconds alone.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Each client prefix's first address: 198.18.(10 + p).1.
fn client(p: u8, i: u8) -> String {
    format!("198.18.{}.{}", 10 + p, 1 + i)
}

const FLOODER: &str = "198.18.40.1";
/// The edge's allowance per /24 (packets a second, and burst).
const RATE: u64 = 1000;
const BURST: u64 = 2000;
const FLOOD_SECS: u64 = 3;
/// The UDP services: 53 over GUE, 54 over FOU.
const UDP_PORTS: [u16; 2] = [53, 54];

/// A backend's servers: HTTP-like on TCP 80 (one line answers each
/// request line, on keep-alive connections), echo on UDP 53 and 54; all answer
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
        // Both families (an IPv4 client is seen as itself, not mapped).
        let listener = TcpListener::bind("[::]:80").expect("bind 80");
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
                    let _ = writeln!(w, "backend {n} peer {}", peer.ip().to_canonical());
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
    for port in UDP_PORTS {
        let (n, flag, seen) = (backend.n, udp_stop.clone(), udp_seen.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        backend.ns.spawn_in(move || {
            // Bound to the service address: its answers leave from it.
            let u = UdpSocket::bind(format!("{VIP}:{port}")).expect("bind the UDP port");
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
    }
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
    /// A connection from `src` to the service address of its family.
    fn open(src: &str) -> Option<Self> {
        let src: std::net::IpAddr = src.parse().ok()?;
        let (domain, vip) = if src.is_ipv6() { (socket2::Domain::IPV6, VIP6) } else { (socket2::Domain::IPV4, VIP) };
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, None).ok()?;
        s.bind(&std::net::SocketAddr::new(src, 0).into()).ok()?;
        let to = std::net::SocketAddr::new(vip.parse().ok()?, 80);
        s.connect_timeout(&to.into(), Duration::from_secs(3)).ok()?;
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

/// How many of the `open` connections (each with the backend that first
/// answered it) are answered by that backend still.
fn on_their_backend(ns: &NetNs, open: &mut [(Conn, u8)]) -> usize {
    ns.run_in(|| open.iter_mut().map(|(conn, b)| conn.ask().map(|a| a.0) == Some(*b)).filter(|k| *k).count())
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
fn spread(ns: &NetNs) -> [usize; 2] {
    ns.run_in(|| {
        let mut n = [0; 2];
        for p in 0..20 {
            for i in 2..4 {
                let (b, _) = Conn::open(&client(p, i)).and_then(|mut c| c.ask()).expect("an answer");
                n[usize::from(b)] += 1;
            }
        }
        n
    })
}

#[test]
#[expect(clippy::too_many_lines, reason = "one test bed, its phases in order")]
fn admitted_packets_reach_the_backends_with_the_clients_addresses() {
    let _alone = limiter_tests::alone(module_path!());
    let _turn = turn();
    let bed = edge("tun");
    let net = &bed.net;
    let (c, edge) = (&net.a, &net.b);
    let mut out;
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
         = \"dns\"\naddress = \"{VIP}\"\nprotocol = \"udp\"\nports = \"53\"\nencapsulation = \"gue\"\nencapsulation_port = \
         {GUE_PORT}\nsource = \"198.19.0.1\"\nbackends = [{{ address = \
         \"{b0}\" }}, {{ address = \"{b1}\" }}]\n{health}\n[[tunnel]]\nname = \"echo\"\naddress = \"{VIP}\"\nprotocol = \
         \"udp\"\nports = \"54\"\nencapsulation = \"fou\"\nencapsulation_port = {FOU_PORT}\nsource = \
         \"198.19.0.1\"\nbackends = [{{ address = \"{b0}\" }}, {{ address = \"{b1}\" }}]\n{health}"
    );
    let mut edge_daemon = pinned_daemon(net, "tun", &policy);
    let socket = edge_daemon.socket.clone();
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

    // UDP over GUE (53) and FOU (54): a query from each prefix, answered
    // directly from the service address, with the client's address seen.
    for port in UDP_PORTS {
        let udp: Vec<String> = c.run_in(|| {
            (0..20)
                .map(|p| {
                    let u = UdpSocket::bind(format!("{}:0", client(p, 0))).unwrap();
                    u.connect(format!("{VIP}:{port}")).unwrap();
                    u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    u.send(b"q").unwrap();
                    let mut buf = [0u8; 128];
                    let n = u.recv(&mut buf).unwrap_or_else(|e| panic!("port {port}: no answer: {e}"));
                    String::from_utf8_lossy(&buf[..n]).into_owned()
                })
                .collect()
        });
        for (p, a) in (0u8..).zip(&udp) {
            assert!(a.ends_with(&format!("peer {}", client(p, 0))), "port {port}: {a}");
        }
        println!("20 UDP queries to port {port} answered from the service address, each client's address seen");
    }

    // A flood from one prefix: the backends get its allowance, no more;
    // `limiter top`, asked once the burst is spent, shows the rate
    // forwarded to the backend its one flow goes to.
    let asked = {
        let socket = socket.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(FLOOD_SECS * 1000 - 500));
            let o = scenario::cli(&socket, &["top", "--once", "-j"]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("top's JSON")
        })
    };
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
    let top = asked.join().expect("top asked");
    let rows = top["backends"].as_array().expect("top lists the backends");
    let rate = |tunnel: &str| -> u64 {
        rows.iter().filter(|r| r["tunnel"] == tunnel).map(|r| r["packets_per_sec"].as_u64().unwrap()).sum()
    };
    println!("limiter top during the flood: {rows:?}");
    assert_eq!(rows.len(), 6, "three tunnels of two backends each");
    assert_eq!(rows[0]["tunnel"], "dns", "the busiest backend first");
    assert!((RATE / 2..=RATE * 3 / 2).contains(&rate("dns")), "the flood's allowance per second: {}", rate("dns"));
    assert!(rate("web") < RATE / 10, "nothing flows to web now: {}", rate("web"));

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
    let kept = on_their_backend(c, &mut open);
    let n = spread(c);
    println!("drained backend 1 with {on1} of 20 open connections on it: {kept} of 20 kept their backend; 40 new: {n:?}");
    assert!(on1 > 0, "some connection was on backend 1");
    assert_eq!(kept, 20, "every open connection stays on its backend");
    assert_eq!(n[1], 0, "a drained backend gets no new flows");

    // kill -9 and a restart over the pins: the program forwards on
    // without the daemon; started again, the daemon takes the drain back
    // from the pinned maps and every open connection stays on its backend.
    edge_daemon.kill_9();
    let kept = on_their_backend(c, &mut open);
    assert_eq!(kept, 20, "the program forwards on while the daemon is down");
    edge_daemon.restart(net);
    let state = state_of(&backend_list(&socket), 0, &b1);
    let kept = on_their_backend(c, &mut open);
    let n = spread(c);
    println!("kill -9 and a restart: backend 1 {state}; {kept} of 20 open connections kept their backend; 40 new: {n:?}");
    assert_eq!(state, "drained", "the operator's drain outlives a restart");
    assert_eq!(kept, 20, "every open connection stays on its backend across the restart");
    assert_eq!(n[1], 0, "the drained backend still gets no new flows");
    out = scenario::cli(&socket, &["backend", "undrain", &b1]);
    assert!(out.status.success());
    out = scenario::cli(&socket, &["backend", "drain", "198.19.9.9"]);
    assert!(!out.status.success(), "a backend no tunnel has is refused");
}

/// A sink on the backend's TCP 81: reads to the end, answers the count.
fn serve_sink(backend: &Backend) {
    let (tx, rx) = std::sync::mpsc::channel();
    backend.ns.spawn_in(move || {
        let listener = TcpListener::bind("0.0.0.0:81").expect("bind 81");
        tx.send(()).unwrap();
        if let Ok((mut c, _)) = listener.accept() {
            let mut n = 0usize;
            let mut buf = vec![0u8; 65536];
            while let Ok(k) = std::io::Read::read(&mut c, &mut buf) {
                if k == 0 {
                    break;
                }
                n += k;
            }
            let _ = writeln!(c, "{n}");
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("the sink started");
}

/// Full-size frames from the client do not fit the path to the backend
/// once wrapped (1,500 + 20 > 1,500): the program answers the first with
/// ICMP "fragmentation needed", the client's path MTU discovery shrinks
/// its segments, and a 1 MiB upload completes.
#[test]
fn a_packet_too_big_once_wrapped_is_answered_and_path_mtu_discovery_completes() {
    let _alone = limiter_tests::alone(module_path!());
    let _turn = turn();
    let bed = edge("tmtu");
    let net = &bed.net;
    let c = &net.a;
    net.add_source(&client(0, 0));
    let backend = Backend::new(&net.b, 0);
    serve_sink(&backend);
    let b0 = backend.addr();
    let policy = format!(
        "rate = 100000\nburst = 100000\n\n[[tunnel]]\nname = \"bulk\"\naddress = \"{VIP}\"\nprotocol = \"tcp\"\nports = \
         81\nsource = \"198.19.0.1\"\nbackends = [{{ address = \"{b0}\" }}]\n[tunnel.health]\nenabled = false\n"
    );
    let edge_daemon = daemon(net, "tmtu", &policy);
    const LEN: usize = 1 << 20;
    let got = c.run_in(|| {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&format!("{}:0", client(0, 0)).parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        s.connect_timeout(&format!("{VIP}:81").parse::<std::net::SocketAddr>().unwrap().into(), Duration::from_secs(3))
            .expect("connects");
        let mut t: TcpStream = s.into();
        t.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let start = Instant::now();
        if let Err(e) = t.write_all(&vec![7u8; LEN]) {
            return (0, start.elapsed(), e.to_string());
        }
        t.shutdown(std::net::Shutdown::Write).unwrap();
        let mut line = String::new();
        let e = BufReader::new(t).read_line(&mut line).err().map(|e| e.to_string()).unwrap_or_default();
        (line.trim().parse::<usize>().unwrap_or(0), start.elapsed(), e)
    });
    let route = c.command("ip").args(["route", "get", VIP, "from", &client(0, 0)]).output().unwrap();
    let route = String::from_utf8_lossy(&route.stdout).into_owned();
    let j = backend_list(&edge_daemon.socket);
    let too_big = j["outcomes"][1].as_u64().unwrap();
    let icmp = c.nstat("IcmpInDestUnreachs");
    println!(
        "1 MiB upload: {} B arrived in {:?} {}; {too_big} packets too big answered; the client's route: {}; the client \
         received {} ICMP unreachables",
        got.0,
        got.1,
        got.2,
        route.trim(),
        icmp
    );
    assert_eq!(got.0, LEN, "the whole upload arrived");
    assert!(too_big >= 1, "a packet was too big and counted");
    assert!(icmp >= 1, "the client was told");
    assert!(route.contains("mtu 1480"), "the client learned the path's MTU: {route}");
}

/// With 1,000 long connections open on two backends, a third joins the
/// pool (a policy reload): every open connection stays on its backend
/// (the connection table holds it), and the new backend takes about a
/// third of the new flows (its share of the Maglev table).
#[test]
fn a_backend_added_moves_no_open_connection_and_takes_its_share_of_new_ones() {
    let _alone = limiter_tests::alone(module_path!());
    let _turn = turn();
    let bed = edge("tpool");
    let (net, c) = (&bed.net, &bed.net.a);
    for p in 0..20 {
        for i in 0..10 {
            net.add_source(&client(p, i));
        }
    }
    let backends = [Backend::new(&net.b, 0), Backend::new(&net.b, 1), Backend::new(&net.b, 2)];
    let _servers: Vec<Arc<AtomicBool>> = backends.iter().map(serve_tcp).collect();
    let pool = |members: &[usize]| {
        let list: Vec<String> =
            members.iter().map(|&n| format!("{{ address = \"{}\" }}", backends[n].addr())).collect();
        format!(
            "rate = 100000\nburst = 100000\n\n[[tunnel]]\nname = \"web\"\naddress = \"{VIP}\"\nprotocol = \"tcp\"\nports = \
             \"80\"\nsource = \"198.19.0.1\"\nbackends = [{}]\n[tunnel.health]\ninterval = \"500ms\"\ntimeout = \"200ms\"\n",
            list.join(", ")
        )
    };
    let edge_daemon = daemon(net, "tpool", &pool(&[0, 1]));
    // 1,000 connections: 5 from each of 200 clients.
    let mut open: Vec<(Conn, u8)> = c.run_in(|| {
        let mut v = Vec::new();
        for p in 0..20 {
            for i in 0..10 {
                for _ in 0..5 {
                    let src = client(p, i);
                    let mut conn = Conn::open(&src).unwrap_or_else(|| panic!("{src} connects"));
                    let (b, _) = conn.ask().expect("answers");
                    v.push((conn, b));
                }
            }
        }
        v
    });
    let before: [usize; 3] = [0, 1, 2].map(|n| open.iter().filter(|(_, b)| *b == n).count());
    let path = edge_daemon.tmp.0.join("policy.toml");
    std::fs::write(&path, pool(&[0, 1, 2])).unwrap();
    let o = scenario::cli(&edge_daemon.socket, &["policy", "apply", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(backend_list(&edge_daemon.socket)["tunnels"][0]["backends"].as_array().unwrap().len(), 3);
    let moved = c.run_in(|| open.iter_mut().filter_map(|(conn, b)| (conn.ask().map(|a| a.0) != Some(*b)).then_some(())).count());
    let new: [usize; 3] = c.run_in(|| {
        let mut n = [0; 3];
        for p in 0..20 {
            for i in 0..10 {
                for _ in 0..2 {
                    let (b, _) = Conn::open(&client(p, i)).and_then(|mut c| c.ask()).expect("an answer");
                    n[usize::from(b)] += 1;
                }
            }
        }
        n
    });
    println!(
        "1,000 open connections on backends {before:?}; a third backend added: {moved} of them moved; 400 new \
         connections: {new:?}"
    );
    assert_eq!(before[2], 0);
    assert_eq!(moved, 0, "no open connection moves");
    let share = new[2] as f64 / 400.0;
    assert!((0.2..=0.47).contains(&share), "the new backend takes about a third of new flows: {share:.2}");

    // Backend 0 taken out of the pool: the connections it held are gone
    // with it (their packets pick again, and the backend they reach
    // knows nothing of them: drain first to keep them), the others stay.
    std::fs::write(&path, pool(&[1, 2])).unwrap();
    let o = scenario::cli(&edge_daemon.socket, &["policy", "apply", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (on0, still0, others_kept) = c.run_in(|| {
        let (mut on0, mut still0, mut kept) = (0, 0, 0);
        for (conn, b) in &mut open {
            let now = conn.ask().map(|a| a.0);
            if *b == 0 {
                on0 += 1;
                still0 += usize::from(now == Some(0));
            } else {
                kept += usize::from(now == Some(*b));
            }
        }
        (on0, still0, kept)
    });
    println!("backend 0 removed: {still0} of its {on0} connections still reach it; {others_kept} of the others kept");
    assert!(on0 > 0);
    assert_eq!(still0, 0, "a removed backend gets no packet of its connections");
    assert_eq!(others_kept, 1000 - on0, "the other backends keep theirs");
}

/// IPv6 clients to an IPv6 service: IPv6 in IPv6 to two backends (the
/// recipe's `ip6ip6` tunnel on Debian's kernels), each client answered by
/// a backend that saw its own address, both backends taking a share.
#[test]
fn ipv6_clients_reach_the_backends_in_ipv6_in_ipv6() {
    let _alone = limiter_tests::alone(module_path!());
    let _turn = turn();
    let bed = edge("tun6");
    let (net, c) = (&bed.net, &bed.net.a);
    limiter_tests::tunnel::sysctl(&net.b, &["net.ipv6.conf.all.forwarding=1"]);
    c.ip("addr add 2001:2::1/64 dev va nodad");
    net.b.ip("addr add 2001:2::2/64 dev vb nodad");
    c.ip(&format!("-6 route add {VIP6}/128 via 2001:2::2"));
    let clients: Vec<String> = (0..20).map(|i| format!("2001:2::{:x}", 0x10 + i)).collect();
    for a in &clients {
        c.ip(&format!("addr add {a}/128 dev va nodad"));
    }
    let backends = [Backend::new(&net.b, 0), Backend::new(&net.b, 1)];
    for b in &backends {
        b.add_v6(&net.b);
    }
    let _servers: Vec<Arc<AtomicBool>> = backends.iter().map(serve_tcp).collect();
    let policy = format!(
        "rate = 100000\nburst = 100000\n\n[[tunnel]]\nname = \"web6\"\naddress = \"{VIP6}\"\nprotocol = \"tcp\"\nports = \
         \"80\"\nsource = \"2001:2:0:20::1\"\nbackends = [{{ address = \"{}\" }}, {{ address = \"{}\" }}]\n[tunnel.health]\ninterval \
         = \"500ms\"\ntimeout = \"200ms\"\n",
        backends[0].addr6(),
        backends[1].addr6()
    );
    let edge_daemon = daemon(net, "tun6", &policy);
    let answers: Vec<(String, Option<(u8, String)>)> = c.run_in(|| {
        clients
            .iter()
            .map(|src| (src.clone(), Conn::open(src).and_then(|mut c| c.ask())))
            .collect()
    });
    let j = backend_list(&edge_daemon.socket);
    let per: [usize; 2] = [0, 1].map(|n| answers.iter().filter(|(_, a)| a.as_ref().is_some_and(|a| a.0 == n)).count());
    println!("20 IPv6 clients: backend 0 took {}, backend 1 took {}; {j}", per[0], per[1]);
    for (src, a) in &answers {
        let (_, seen) = a.as_ref().unwrap_or_else(|| panic!("{src}: no answer; {j}"));
        assert_eq!(seen, src, "the backend saw the client's own address");
    }
    assert!(per.iter().all(|&n| n >= 3), "each backend takes a share: {per:?}");
    for b in &backends {
        if let Some(d) = &b.decap {
            assert_eq!(d.bad.load(Ordering::Relaxed), 0, "inner packets that were not whole IPv6 packets");
        }
    }
}
