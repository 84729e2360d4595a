//! A fleet on one machine: a `redis-server` (or a 3-master Redis Cluster)
//! started here on private sockets, and N daemons, each on its own veth
//! pair in namespaces made here; one client prefix's packets spread at
//! random over the nodes on a schedule, and every packet that XDP lets
//! through received and time-stamped at its node.

use std::{
    net::UdpSocket,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    kernel::TempDir,
    netns::{B_ADDR, B_IF, NetNs, VethPair},
    scenario::{Guard, PORT, locate_bin, spawn_lines, unique_socket, wait_for},
};

/// Wall-clock Unix ns.
#[must_use]
pub fn wall_ns() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())).unwrap_or(0)
}

/// A `redis-server` on a Unix socket (reachable from every namespace).
pub struct Redis {
    pub socket: PathBuf,
    dir: PathBuf,
    server: Option<Guard>,
}

impl Redis {
    /// Start one in `dir`.
    #[must_use]
    pub fn unix(dir: &Path) -> Self {
        let mut r = Self { socket: dir.join("redis.sock"), dir: dir.to_owned(), server: None };
        r.start();
        r
    }

    /// The address daemons are given.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    /// (Re)start it on the same socket.
    pub fn start(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let mut c = Command::new("redis-server");
        c.args(["--port", "0", "--save", "", "--appendonly", "no", "--unixsocketperm", "700", "--unixsocket"])
            .arg(&self.socket)
            .arg("--dir")
            .arg(&self.dir);
        self.server = Some(Guard(
            c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("redis-server (cargo xtask setup)"),
        ));
        for _ in 0..200 {
            if self.cli(&["PING"]).contains("PONG") {
                return;
            }
            thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not answer on {}", self.socket.display());
    }

    /// Kill it (SIGKILL: a crash, not a clean shutdown).
    pub fn kill(&mut self) {
        if let Some(mut g) = self.server.take() {
            let _ = g.0.kill();
            let _ = g.0.wait();
        }
    }

    /// `redis-cli` on its socket.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        let o = Command::new("redis-cli").arg("-s").arg(&self.socket).args(args).output();
        o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }
}

/// A 3-master Redis Cluster in a namespace of its own, reachable over a
/// bridge (198.19.255.1, ports 7001-7003) from namespaces that
/// [`Cluster::join`] links to it.
pub struct Cluster {
    pub ns: NetNs,
    _servers: Vec<Guard>,
    _dir: TempDir,
    links: u32,
}

/// The cluster's address on its bridge.
pub const CLUSTER_ADDR: &str = "198.19.255.1";

impl Cluster {
    #[must_use]
    pub fn start(tag: &str) -> Self {
        let ns = NetNs::new(tag);
        ns.ip("link add br0 type bridge");
        ns.ip(&format!("addr add {CLUSTER_ADDR}/24 dev br0"));
        ns.ip("link set br0 up");
        let dir = TempDir::new(tag);
        let mut servers = Vec::new();
        for port in 7001..=7003u16 {
            let d = dir.0.join(port.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let mut c = ns.net_command("redis-server");
            c.args([
                "--bind",
                CLUSTER_ADDR,
                "--port",
                &port.to_string(),
                "--cluster-enabled",
                "yes",
                "--protected-mode",
                "no",
            ])
            .args(["--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no", "--dir"])
            .arg(&d);
            servers.push(Guard(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("redis-server")));
        }
        let cli = |args: &[&str]| {
            let o = ns.net_command("redis-cli").args(args).output().expect("redis-cli");
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        };
        for port in ["7001", "7002", "7003"] {
            let mut up = false;
            for _ in 0..200 {
                if cli(&["-h", CLUSTER_ADDR, "-p", port, "PING"]).contains("PONG") {
                    up = true;
                    break;
                }
                thread::sleep(Duration::from_millis(25));
            }
            assert!(up, "cluster node {port} did not start");
        }
        let nodes: Vec<String> = (7001..=7003).map(|p| format!("{CLUSTER_ADDR}:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = cli(&args);
        assert!(out.contains("[OK] All 16384 slots covered"), "redis-cli --cluster create: {out}");
        for _ in 0..200 {
            if cli(&["-h", CLUSTER_ADDR, "-p", "7001", "CLUSTER", "INFO"]).contains("cluster_state:ok") {
                return Self { ns, _servers: servers, _dir: dir, links: 0 };
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster never reached cluster_state:ok");
    }

    /// Link namespace `ns` to the cluster's bridge.
    pub fn join(&mut self, ns: &NetNs) {
        self.links += 1;
        let (here, there) = (format!("cs{}", self.links), format!("cb{}", self.links));
        ns.ip(&format!("link add {here} type veth peer name {there} netns {}", self.ns.name));
        ns.ip(&format!("addr add 198.19.255.{}/24 dev {here}", 10 + self.links));
        ns.ip(&format!("link set {here} up"));
        self.ns.ip(&format!("link set {there} master br0"));
        self.ns.ip(&format!("link set {there} up"));
    }

    /// The store addresses daemons are given.
    #[must_use]
    pub fn urls() -> Vec<String> {
        (7001..=7003).map(|p| format!("redis://{CLUSTER_ADDR}:{p}")).collect()
    }
}

/// One node: a veth pair whose `b` side runs a daemon.
pub struct Node {
    pub net: VethPair,
    pub daemon: Guard,
    /// Its output (in a mutex, so a node can be shared with test threads).
    pub log: std::sync::Mutex<mpsc::Receiver<String>>,
    pub socket: PathBuf,
}

/// Start `n` daemons with the same `policy`, except `{node}` replaced by
/// each node's name (n0, n1, ...); `before` runs on each pair before its
/// daemon starts (to link it to a cluster, say). Each sender namespace
/// gets the `sources` addresses.
pub fn start_nodes(
    tag: &str,
    n: usize,
    policy: &str,
    sources: &[&str],
    dir: &Path,
    before: impl FnMut(&VethPair),
) -> Vec<Node> {
    start_nodes_wrapped(tag, n, policy, sources, dir, before, |_| Vec::new())
}

/// [`start_nodes`], each daemon's command line behind `wrap(i)` (a
/// program and its arguments, such as `faketime -f +5s`; empty: none).
pub fn start_nodes_wrapped(
    tag: &str,
    n: usize,
    policy: &str,
    sources: &[&str],
    dir: &Path,
    mut before: impl FnMut(&VethPair),
    wrap: impl Fn(usize) -> Vec<String>,
) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let net = VethPair::new(&format!("{tag}{i}"));
            for s in sources {
                net.add_source(s);
            }
            before(&net);
            let file = dir.join(format!("policy-n{i}.toml"));
            std::fs::write(&file, policy.replace("{node}", &format!("n{i}"))).unwrap();
            let socket = unique_socket(&format!("{tag}{i}"));
            let pre = wrap(i);
            let mut c = match pre.split_first() {
                Some((prog, args)) => {
                    let mut c = net.b.net_command(prog);
                    c.args(args).arg(locate_bin("limiter").unwrap());
                    c
                }
                None => net.b.net_command(locate_bin("limiter").unwrap()),
            };
            c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"])
                .arg(&file)
                .arg("--socket")
                .arg(&socket);
            let (daemon, log) = spawn_lines(c).unwrap();
            let mut seen = String::new();
            wait_for(&log, "control socket", Duration::from_secs(20), &mut seen).unwrap();
            Node { net, daemon, log: std::sync::Mutex::new(log), socket }
        })
        .collect()
}

/// One client's packets: its source address and send times (Unix ns).
pub struct Flow {
    pub src: &'static str,
    pub times: Vec<u64>,
}

/// A seeded 32-bit linear congruential generator (the case study's).
pub struct Lcg(u32);

impl Lcg {
    #[must_use]
    pub fn new(seed: u32) -> Self {
        Self(seed)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        usize::try_from((u64::from(self.0) * n as u64) >> 32).unwrap_or(0)
    }
}

/// The node of each packet of each flow: `seed`'s generator drawn packet
/// after packet, flow after flow (the case study's for one flow).
#[must_use]
pub fn assign(flows: &[Flow], nodes: usize, seed: u32) -> Vec<Vec<usize>> {
    let mut rng = Lcg::new(seed);
    flows.iter().map(|f| f.times.iter().map(|_| rng.below(nodes)).collect()).collect()
}

/// Send every flow's packets, each to a node picked at random, at their
/// times; return, per flow, the receipt times (Unix ns) of the packets
/// that got through, merged over the nodes, and how many were sent.
#[must_use]
pub fn run(nodes: &[Node], flows: &[Flow], seed: u32) -> Vec<(usize, Vec<u64>)> {
    run_to(nodes, flows, seed, PORT)
}

/// [`run`] to UDP port `port`.
#[must_use]
pub fn run_to(nodes: &[Node], flows: &[Flow], seed: u32, port: u16) -> Vec<(usize, Vec<u64>)> {
    run_assigned(nodes, flows, &assign(flows, nodes.len(), seed), port)
}

/// [`run`] with each packet's node given: `to[f][i]` for packet `i` of
/// flow `f` (see [`assign`]).
#[must_use]
pub fn run_assigned(nodes: &[Node], flows: &[Flow], to: &[Vec<usize>], port: u16) -> Vec<(usize, Vec<u64>)> {
    let mut plan: Vec<Vec<(u64, usize)>> = vec![Vec::new(); nodes.len()];
    for (f, (flow, to)) in flows.iter().zip(to).enumerate() {
        for (&t, &node) in flow.times.iter().zip(to) {
            plan[node].push((t, f));
        }
    }
    for p in &mut plan {
        p.sort_unstable();
    }
    let end = flows.iter().filter_map(|f| f.times.last()).max().copied().unwrap_or(0) + 500_000_000;
    let srcs: Vec<&str> = flows.iter().map(|f| f.src).collect();
    let got: Vec<Vec<(String, u64)>> = thread::scope(|s| {
        let receivers: Vec<_> = nodes
            .iter()
            .map(|node| {
                let ns = &node.net.b;
                s.spawn(move || ns.run_in(|| receive(end, port)))
            })
            .collect();
        thread::sleep(Duration::from_millis(100));
        let senders: Vec<_> = nodes
            .iter()
            .zip(&plan)
            .map(|(node, plan)| {
                let ns = &node.net.a;
                let srcs = &srcs;
                s.spawn(move || ns.run_in(|| send(plan, srcs, port)))
            })
            .collect();
        let late = senders.into_iter().map(|h| h.join().unwrap()).max().unwrap_or(0);
        LAST_LATE_NS.store(late, std::sync::atomic::Ordering::Relaxed);
        if late > LATE_NS {
            println!("fleet harness: a sender ran {} ms behind its schedule", late / 1_000_000);
        }
        receivers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    flows
        .iter()
        .map(|f| {
            let mut t: Vec<u64> = got.iter().flatten().filter(|(src, _)| src == f.src).map(|(_, t)| *t).collect();
            t.sort_unstable();
            (f.times.len(), t)
        })
        .collect()
}

/// How far behind its schedule a sender may fall before a run is said
/// not to have sent what it was asked to.
pub const LATE_NS: u64 = 20_000_000;

static LAST_LATE_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How far behind its schedule the last run's slowest packet was sent:
/// past [`LATE_NS`] the machine descheduled a sender, which then sent its
/// backlog at once, so a flow meant to be exactly at its rate was not.
#[must_use]
pub fn last_run_late_ns() -> u64 {
    LAST_LATE_NS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Send the plan on time; how late the latest packet went out.
fn send(plan: &[(u64, usize)], srcs: &[&str], port: u16) -> u64 {
    let socks: Vec<UdpSocket> = srcs.iter().map(|s| UdpSocket::bind((*s, 0)).expect("bind the source")).collect();
    let mut late = 0;
    for &(t, f) in plan {
        let now = wall_ns();
        if t > now {
            thread::sleep(Duration::from_nanos(t - now));
        }
        late = late.max(wall_ns().saturating_sub(t));
        let _ = socks[f].send_to(b"x", (B_ADDR, port));
    }
    late
}

/// Each datagram's source and the kernel's time of its arrival: a
/// receiver descheduled for a while would otherwise stamp its backlog as
/// one burst and crowd a window that the data plane never crowded.
fn receive(until: u64, port: u16) -> Vec<(String, u64)> {
    use std::os::fd::AsRawFd as _;
    let sock = UdpSocket::bind(("0.0.0.0", port)).expect("bind the receiver");
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and an int option.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&raw const on).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap(),
        )
    };
    assert_eq!(r, 0, "SO_TIMESTAMPNS: {}", std::io::Error::last_os_error());
    let mut out = Vec::new();
    while wall_ns() < until {
        if let Some(got) = recv_stamped(&sock) {
            out.push(got);
        }
    }
    out
}

/// One datagram: its IPv4 source and the kernel's arrival time (Unix ns).
fn recv_stamped(sock: &UdpSocket) -> Option<(String, u64)> {
    use std::os::fd::AsRawFd as _;
    let mut buf = [0u8; 64];
    // SAFETY: plain C structs, all-zero valid.
    let mut name: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>()).unwrap();
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at buffers that live through the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, 0) };
    if n < 0 || i32::from(name.sin_family) != libc::AF_INET {
        return None;
    }
    let src = std::net::Ipv4Addr::from(u32::from_be(name.sin_addr.s_addr)).to_string();
    let mut at = None;
    // SAFETY: walking the control messages the kernel wrote into `control`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !c.is_null() {
        // SAFETY: c points at a control message header inside `control`.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_TIMESTAMPNS {
            // SAFETY: its data is a timespec; read unaligned.
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
            at = Some(u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0));
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(&raw const msg, c) };
    }
    Some((src, at.unwrap_or_else(wall_ns)))
}

/// Most receipts in any `[t, t + w)`.
#[must_use]
pub fn busiest(times: &[u64], w: u64) -> usize {
    let (mut best, mut j) = (0, 0);
    for i in 0..times.len() {
        while times[i] - times[j] >= w {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best
}

/// `rate` packets a second for `secs`, starting at the first slice
/// boundary (of `slice_ns`) after `lead_ns` from now, plus `phase_ns`.
#[must_use]
pub fn schedule(rate: u64, secs: u64, slice_ns: u64, lead_ns: u64, phase_ns: u64) -> Vec<u64> {
    let start = (wall_ns() + lead_ns).div_ceil(slice_ns) * slice_ns + phase_ns;
    (0..rate * secs).map(|i| start + i * 1_000_000_000 / rate).collect()
}

/// Wait until `f` holds, up to `timeout`.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}
