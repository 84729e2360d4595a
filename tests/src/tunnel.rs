//! The tunnels' test bed: a client namespace, the edge (the daemon's
//! namespace, forwarding enabled), and backends, each its own namespace
//! joined to the edge by a veth pair of its own (198.19.N.1 on the edge,
//! 198.19.N.2 on the backend), with the service address on its loopback
//! and its default route back through the edge (its answers go to the
//! clients directly, not through the tunnel). A backend decapsulates as
//! the recipe in docs/tunnel.md says (the kernel's `tunl0`), or, on a
//! kernel built without IPIP (this machine's), with [`Decap`]: a raw
//! socket takes each IPIP packet, checks its outer header and writes the
//! inner packet to a TUN device, which the kernel then receives as
//! `tunl0` would have.

use std::{
    io::Read as _,
    net::Ipv4Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use crate::{
    kernel::TempDir,
    netns::{B_IF, NetNs, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

/// The service address the clients reach.
pub const VIP: &str = "198.18.7.100";
/// The IPv6 service address.
pub const VIP6: &str = "2001:2:0:7::100";
/// The backends' GUE port.
pub const GUE_PORT: u16 = 5555;
/// The backends' FOU port (IPIP in UDP, no header of its own).
pub const FOU_PORT: u16 = 5556;

/// Run `sysctl -w` for each setting in `ns`.
pub fn sysctl(ns: &NetNs, settings: &[&str]) {
    for s in settings {
        let o = ns.command("sysctl").args(["-qw", s]).output().expect("sysctl runs");
        assert!(o.status.success(), "sysctl {s}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The client and the edge: the edge forwards (`bpf_fib_lookup` answers
/// nothing on an interface that does not), the client reaches the
/// service address through it, and its segments carry whole checksums,
/// as off a wire (a veth leaves them to an offload that a frame the
/// program forwards never meets), and it takes the frames the program
/// sends back with `XDP_TX` (a veth takes them only while its peer runs
/// an XDP program: the client's end runs one that passes everything).
pub struct Edge {
    pub net: VethPair,
    /// The client's pass-everything program, attached while this lives.
    pub client_xdp: limiter::dataplane::DataPlane,
}

#[must_use]
pub fn edge(tag: &str) -> Edge {
    crate::kernel::require_root();
    scenario::raise_nofile();
    let net = VethPair::new(tag);
    sysctl(&net.b, &["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]);
    net.a.ip(&format!("route add {VIP}/32 via 198.18.0.2"));
    let out = net.a.command("ethtool").args(["-K", "va", "tx", "off"]).output().expect("ethtool runs");
    assert!(out.status.success(), "ethtool: {}", String::from_utf8_lossy(&out.stderr));
    let mut client_xdp = limiter::dataplane::DataPlane::open_bench(1024).expect("the bench object loads");
    net.a.run_in(|| {
        client_xdp
            .attach_entry(
                limiter_common::programs::BENCH_PASS,
                crate::netns::A_IF,
                limiter::dataplane::AttachMode::Native,
            )
            .expect("a pass program on the client's end");
    });
    Edge { net, client_xdp }
}

/// The daemon on the edge with `policy`, its control socket ready; with
/// pins, unloaded (link, program and maps) when dropped.
pub struct Daemon {
    pub guard: Guard,
    pub socket: std::path::PathBuf,
    pub tmp: TempDir,
    /// Its pin directory, when run with `--pin`: unloaded when dropped,
    /// after `guard` (declared before it) has stopped the daemon.
    pub pins: Option<scenario::Pins>,
}

#[must_use]
pub fn daemon(net: &VethPair, tag: &str, policy: &str) -> Daemon {
    start(net, tag, policy, false)
}

/// [`daemon`] with `--pin`, in a pin directory of this process's own.
#[must_use]
pub fn pinned_daemon(net: &VethPair, tag: &str, policy: &str) -> Daemon {
    start(net, tag, policy, true)
}

fn start(net: &VethPair, tag: &str, policy: &str, pin: bool) -> Daemon {
    let tmp = TempDir::new(tag);
    std::fs::write(tmp.0.join("policy.toml"), policy).unwrap();
    let pins = pin.then(|| {
        scenario::Pins(std::path::PathBuf::from(format!("/sys/fs/bpf/limiter-test-{tag}-{}", std::process::id())))
    });
    let socket = unique_socket(tag);
    let guard = spawn(net, &tmp, &socket, pins.as_ref().map(|p| p.0.as_path()));
    Daemon { guard, socket, tmp, pins }
}

fn spawn(net: &VethPair, tmp: &TempDir, socket: &std::path::Path, pins: Option<&std::path::Path>) -> Guard {
    let mut cmd = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"])
        .arg(tmp.0.join("policy.toml"))
        .arg("--socket")
        .arg(socket);
    if let Some(p) = pins {
        cmd.arg("--pin").arg("--pin-dir").arg(p);
    }
    let (guard, log) = spawn_lines(cmd).unwrap();
    let mut seen = String::new();
    // Under emulation (the guest tier) the verifier alone takes tens of
    // seconds.
    wait_for(&log, "control socket", Duration::from_secs(90), &mut seen).unwrap();
    guard
}

impl Daemon {
    /// `kill -9` the daemon (a pinned program keeps running without it).
    pub fn kill_9(&mut self) {
        let _ = self.guard.0.kill();
        let _ = self.guard.0.wait();
    }

    /// Start it again, as it was started, after [`Daemon::kill_9`].
    pub fn restart(&mut self, net: &VethPair) {
        let _ = std::fs::remove_file(&self.socket);
        let pins = self.pins.as_ref().map(|p| p.0.as_path());
        let old = std::mem::replace(&mut self.guard, spawn(net, &self.tmp, &self.socket, pins));
        // Killed and reaped already: no signal for its pid.
        std::mem::forget(old);
    }
}

/// `limiter backend list --json`.
#[must_use]
pub fn backend_list(socket: &std::path::Path) -> serde_json::Value {
    let o = scenario::cli(socket, &["backend", "list", "--json"]);
    assert!(o.status.success(), "backend list: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// The backends [`fib_ns`] knows as static neighbours, and their MACs
/// (its IPv6 backend, 2001:2:0:19::2, has the first MAC).
pub const FIB_BACKENDS: [[u8; 4]; 2] = [[198, 19, 0, 2], [198, 19, 0, 3]];
pub const FIB_MACS: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 3]];

/// For BPF_PROG_TEST_RUN of the tunnel (the kernel tier, the bench): a
/// namespace that forwards, with a veth `k0` toward the backends and
/// their addresses as static neighbours; `k0`'s MAC.
#[must_use]
pub fn fib_ns() -> (NetNs, [u8; 6]) {
    let ns = NetNs::new("ktun");
    sysctl(&ns, &["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]);
    ns.ip("link add k0 type veth peer name k1");
    ns.ip("addr add 198.19.0.1/24 dev k0");
    ns.ip("addr add 2001:2:0:19::1/64 dev k0 nodad");
    ns.ip("link set k0 up");
    ns.ip("link set k1 up");
    for (b, mac) in FIB_BACKENDS.iter().zip(FIB_MACS) {
        let mac = mac.map(|m| format!("{m:02x}")).join(":");
        ns.ip(&format!("neigh add {} lladdr {mac} dev k0 nud permanent", Ipv4Addr::from(*b)));
    }
    ns.ip("neigh add 2001:2:0:19::2 lladdr 02:00:00:00:00:02 dev k0 nud permanent");
    let o = ns.command("cat").arg("/sys/class/net/k0/address").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mac: Vec<u8> = text.trim().split(':').map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    (ns, mac.try_into().unwrap())
}

/// A backend namespace joined to `edge`.
pub struct Backend {
    pub ns: NetNs,
    pub n: u8,
    /// Set when the kernel decapsulates (else [`Backend::decap`] does).
    pub kernel: bool,
    pub decap: Option<Decap>,
    /// With [`Decap`]: a pass-everything program on the backend's end, so
    /// it takes redirected frames with GRO off (GRO would merge the IPIP
    /// segments into packets only the kernel's tunnel knows to split).
    pub xdp: Option<limiter::dataplane::DataPlane>,
}

impl Backend {
    /// Backend `n`: its link to the edge, the service address on its
    /// loopback, its default route through the edge, its decapsulation.
    #[must_use]
    pub fn new(edge: &NetNs, n: u8) -> Self {
        let ns = NetNs::new(&format!("tb{n}"));
        let (e, b) = (format!("te{n}"), format!("tb{n}"));
        edge.ip(&format!("link add {e} type veth peer name {b} netns {}", ns.name));
        edge.ip(&format!("addr add 198.19.{n}.1/24 dev {e}"));
        ns.ip(&format!("addr add 198.19.{n}.2/24 dev {b}"));
        edge.ip(&format!("link set {e} up"));
        ns.ip(&format!("link set {b} up"));
        // Frames the edge's program redirects here arrive through NAPI,
        // which a veth runs for an XDP program or with GRO on.
        let o = ns.command("ethtool").args(["-K", &b, "gro", "on"]).output().expect("ethtool runs");
        assert!(o.status.success(), "ethtool: {}", String::from_utf8_lossy(&o.stderr));
        ns.ip(&format!("addr add {VIP}/32 dev lo"));
        ns.ip(&format!("route add default via 198.19.{n}.1 dev {b}"));
        sysctl(&ns, &["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]);
        let _ = std::process::Command::new("modprobe").arg("ipip").output();
        let kernel = ns.command("ip").args(["link", "set", "tunl0", "up"]).output().is_ok_and(|o| o.status.success());
        let (decap, xdp) = if kernel {
            sysctl(&ns, &["net.ipv4.conf.tunl0.rp_filter=0"]);
            let _ = std::process::Command::new("modprobe").arg("fou").output();
            ns.ip(&format!("fou add port {GUE_PORT} gue"));
            ns.ip(&format!("fou add port {FOU_PORT} ipproto 4"));
            (None, None)
        } else {
            let o = ns.command("ethtool").args(["-K", &b, "gro", "off"]).output().expect("ethtool runs");
            assert!(o.status.success(), "ethtool: {}", String::from_utf8_lossy(&o.stderr));
            let mut xdp = limiter::dataplane::DataPlane::open_bench(1024).expect("the bench object loads");
            ns.run_in(|| {
                xdp.attach_entry(limiter_common::programs::BENCH_PASS, &b, limiter::dataplane::AttachMode::Native)
                    .expect("a pass program on the backend's end");
            });
            (Some(Decap::start(&ns)), Some(xdp))
        };
        Self { ns, n, kernel, decap, xdp }
    }

    /// This backend's address (the tunnel's outer destination).
    #[must_use]
    pub fn addr(&self) -> String {
        format!("198.19.{}.2", self.n)
    }

    /// This backend's IPv6 address, after [`Backend::add_v6`].
    #[must_use]
    pub fn addr6(&self) -> String {
        format!("2001:2:0:2{}::2", self.n)
    }

    /// IPv6 beside IPv4: 2001:2:0:2N::1 on the edge's end, ::2 on the
    /// backend's, [`VIP6`] on its loopback, its IPv6 default route through
    /// the edge, and IPv6-in-IPv6 taken by the recipe's `t6` (or by
    /// [`Decap`], which always listens for it).
    pub fn add_v6(&self, edge: &NetNs) {
        let (n, addr6) = (self.n, self.addr6());
        edge.ip(&format!("addr add 2001:2:0:2{n}::1/64 dev te{n} nodad"));
        self.ns.ip(&format!("addr add {addr6}/64 dev tb{n} nodad"));
        self.ns.ip(&format!("addr add {VIP6}/128 dev lo"));
        self.ns.ip(&format!("-6 route add default via 2001:2:0:2{n}::1 dev tb{n}"));
        if self.kernel {
            let _ = std::process::Command::new("modprobe").arg("ip6_tunnel").output();
            self.ns.ip(&format!("-6 tunnel add t6 mode ip6ip6 local {addr6} remote any"));
            self.ns.ip("link set t6 up");
        }
    }
}

/// A userspace stand-in for `tunl0`: IPIP packets in, their inner packets
/// out of a TUN device, each outer header checked on the way.
pub struct Decap {
    stop: Arc<AtomicBool>,
    /// Outer headers whose checksum, version, length or TTL was wrong.
    pub bad: Arc<AtomicU64>,
    pub packets: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

/// The one's-complement sum of `bytes`' 16-bit words (an odd last byte
/// padded with 0) and `init`, folded: 0xffff over a header or message
/// with its checksum in place. The tests' own, not the program's.
#[must_use]
pub fn ones_sum(bytes: &[u8], init: u32) -> u16 {
    let mut s = bytes.chunks(2).fold(init, |s, w| s + u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])));
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).expect("folded to 16 bits")
}

fn sum_ok(h: &[u8]) -> bool {
    ones_sum(h, 0) == 0xffff
}

/// Reads on `fd` give up after 100 ms (the threads look at their stop
/// flag between reads).
fn rcv_timeout(fd: libc::c_int) {
    let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    // SAFETY: setsockopt with a timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap(),
        );
    }
}

impl Decap {
    fn start(ns: &NetNs) -> Self {
        let (stop, bad, packets) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (s, b, p) = (stop.clone(), bad.clone(), packets.clone());
        let thread = ns.spawn_in(move || {
            // SAFETY: plain system calls on descriptors this thread owns.
            let tun = unsafe {
                let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR);
                assert!(fd >= 0, "open /dev/net/tun: {}", std::io::Error::last_os_error());
                let mut req = IfReq { name: [0; 16], flags: IFF_TUN | IFF_NO_PI, pad: [0; 22] };
                req.name[..4].copy_from_slice(b"dec0");
                assert_eq!(
                    libc::ioctl(fd, TUNSETIFF, &raw mut req),
                    0,
                    "TUNSETIFF: {}",
                    std::io::Error::last_os_error()
                );
                OwnedFd::from_raw_fd(fd)
            };
            // SAFETY: as above.
            let raw = unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, 4);
                assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
                rcv_timeout(fd);
                std::fs::File::from_raw_fd(fd)
            };
            // GUE on `GUE_PORT`: its 4-byte header (version 0, no flags,
            // the inner protocol 4), then the inner packet; FOU on
            // `FOU_PORT`: the inner packet alone.
            for (port, header) in [(GUE_PORT, &[0u8, 4, 0, 0][..]), (FOU_PORT, &[][..])] {
                let (udp_tun, us, ub, up) = (tun.try_clone().unwrap(), s.clone(), b.clone(), p.clone());
                let udp = std::net::UdpSocket::bind(("0.0.0.0", port)).expect("bind the GUE and FOU ports");
                udp.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while !us.load(Ordering::Relaxed) {
                        let Ok(n) = udp.recv(&mut buf) else { continue };
                        let inner = header.len();
                        if n < inner + 20 || buf[..inner] != *header || buf[inner] >> 4 != 4 {
                            ub.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        up.fetch_add(1, Ordering::Relaxed);
                        // SAFETY: a write of a buffer to the TUN descriptor.
                        unsafe { libc::write(udp_tun.as_raw_fd(), buf[inner..n].as_ptr().cast(), n - inner) };
                    }
                });
            }
            // IPv6 in IPv6: a raw socket of protocol 41 gets the inner
            // packet (an IPv6 raw socket is given no outer header).
            // SAFETY: as above.
            let raw6 = unsafe {
                let fd = libc::socket(libc::AF_INET6, libc::SOCK_RAW, 41);
                assert!(fd >= 0, "raw IPv6 socket: {}", std::io::Error::last_os_error());
                rcv_timeout(fd);
                std::fs::File::from_raw_fd(fd)
            };
            let (tun6, s6, b6, p6) = (tun.try_clone().unwrap(), s.clone(), b.clone(), p.clone());
            thread::spawn(move || {
                let mut raw6 = raw6;
                let mut buf = vec![0u8; 65536];
                while !s6.load(Ordering::Relaxed) {
                    let Ok(n) = raw6.read(&mut buf) else { continue };
                    let total = 40 + usize::from(u16::from_be_bytes([buf[4], buf[5]]));
                    if n < 40 || buf[0] >> 4 != 6 || total != n {
                        b6.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    p6.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: a write of a buffer to the TUN descriptor.
                    unsafe { libc::write(tun6.as_raw_fd(), buf.as_ptr().cast(), n) };
                }
            });
            tx.send(()).unwrap();
            let mut raw = raw;
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                let Ok(n) = raw.read(&mut buf) else { continue };
                let pkt = &buf[..n];
                let ihl = usize::from(pkt[0] & 0xf) * 4;
                let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
                if pkt[0] >> 4 != 4 || ihl < 20 || n < ihl + 20 || total != n || pkt[8] == 0 || !sum_ok(&pkt[..ihl]) {
                    b.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                p.fetch_add(1, Ordering::Relaxed);
                let inner = &pkt[ihl..];
                // SAFETY: a write of a buffer to the TUN descriptor.
                unsafe { libc::write(tun.as_raw_fd(), inner.as_ptr().cast(), inner.len()) };
            }
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("the decapsulator started");
        ns.ip("link set dec0 up");
        sysctl(ns, &["net.ipv4.conf.dec0.rp_filter=0"]);
        Self { stop, bad, packets, thread: Some(thread) }
    }
}

impl Drop for Decap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
