//! `bench system-tcp-state`: a live flood of out-of-state ACKs over a veth
//! pair, side by side: the kernel alone (a listener on the port, no
//! filter: it answers each segment with a RST), nftables' `ct state
//! invalid drop` with conntrack (with `nf_conntrack_tcp_loose = 0`, the
//! setting under which conntrack calls a bare ACK invalid, and with
//! Debian's default 1, under which it adopts the ACK as a connection),
//! and the limiter's out-of-state check as shipped (`auto`, every
//! prefix far under its allowance).
//!
//! The generator is an AF_PACKET socket on CPU 0 sending prebuilt frames
//! in batches (`sendmmsg`): ACKs from 4,096 random sources in
//! 198.19.0.0/16 (256 /24s), checksums right. (`bench system`'s
//! live-frames generator is refused, EPERM, by some kernels.) The
//! receiving veth's NAPI runs in a thread pinned to CPU 1, so the
//! thread's own run time (`/proc/PID/schedstat`, in ns) is everything the
//! receiver does: its XDP program, and for the others the socket buffer,
//! netfilter, TCP and the RST sent back. The generator's side drops the
//! RSTs in XDP, as an attacker's network absorbs them.
//!
//! `LIMITER_BENCH_PROFILE=1`: `perf record` on CPU 1 during the bare
//! drop's and the limiter's rows, and what the limiter adds by kernel
//! symbol (its program, its judge, the kernel's socket lookup) and by
//! line of every function of its program.

use std::time::Duration;

use limiter::dataplane::{AttachMode, DataPlane};
use limiter_common::{Reason, gcra, programs};
use limiter_tests::{
    kernel,
    netns::{A_IF, B_ADDR, B_IF, NetNs, VethPair},
    packet::{ETH_P_IP, Frame, IPPROTO_TCP},
};

use crate::{
    jitlines::JitLines,
    profile::{self, Profile, Recording},
    system::{napi_threads, nft_counter, nft_load, pin_to_cpu, receiver_on_cpu1, run, veth_stat},
};

const PORT: u16 = 443;
const ROUNDS: usize = 3;
const ACK: u8 = 0x10;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Rx {
    /// A bare `XDP_DROP`: what the harness costs the receiver per frame
    /// (the veth's ring, the generator's socket buffer freed here).
    Floor,
    Kernel,
    /// `ct state invalid drop`, `nf_conntrack_tcp_loose` = 0 or 1.
    Conntrack {
        loose: bool,
    },
    Limiter,
}

impl Rx {
    fn label(self) -> &'static str {
        match self {
            Self::Floor => "bare XDP_DROP (the harness's floor)",
            Self::Kernel => "kernel alone (a RST for each)",
            Self::Conntrack { loose: false } => "nftables ct state invalid, tcp_loose 0",
            Self::Conntrack { loose: true } => "nftables ct state invalid, tcp_loose 1",
            Self::Limiter => "limiter, tcp_state = auto",
        }
    }
}

struct Row {
    rx: Rx,
    frames: u64,
    received: u64,
    dropped: u64,
    rsts: u64,
    cpu_secs: f64,
    /// With `LIMITER_BENCH_PROFILE`, the bare drop's and the limiter's.
    profile: Profile,
}

impl Row {
    /// The receiver's run time per segment received, in ns.
    fn ns(&self) -> f64 {
        self.cpu_secs * 1e9 / self.received.max(1) as f64
    }
}

fn nft_invalid(ns: &NetNs, loose: bool) {
    nft_load(
        ns,
        "table inet bench {
  chain pre {
    type filter hook prerouting priority -150; policy accept;
    ct state invalid counter drop
  }
}
",
    );
    // The rules loaded nf_conntrack; the sysctl is per namespace.
    let loose = format!("net.netfilter.nf_conntrack_tcp_loose={}", u8::from(loose));
    run(ns.command("sysctl").args(["-qw", &loose]));
}

/// Frames the generator cycles through.
const FRAMES: usize = 4_096;
/// Frames per `sendmmsg` call.
const BATCH: u32 = 256;
const _: () = assert!(FRAMES.is_multiple_of(BATCH as usize), "every batch within the frames");
/// Seconds of flood per row.
const SECS: f64 = 3.0;

/// Bare ACKs to the receiver's port from random sources in
/// 198.19.0.0/16, random ports and sequence numbers, both checksums right.
fn ack_frames() -> Vec<Vec<u8>> {
    let dst: std::net::Ipv4Addr = B_ADDR.parse().expect("an IPv4 address");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..FRAMES)
        .map(|_| {
            let r = next().to_be_bytes();
            let src = std::net::Ipv4Addr::new(198, 19, r[0], r[1]);
            let sport = u16::from_be_bytes([r[2], r[3]]) | 1024;
            let f = Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_TCP, 0, 0).tcp_ports(sport, PORT, ACK).to_v4(dst);
            let mut f = f.on_the_wire();
            f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
            // A sequence and an acknowledgement number, a window, then
            // the checksum.
            f[38..46].copy_from_slice(&r);
            f[48..50].copy_from_slice(&512u16.to_be_bytes());
            f[50..52].fill(0);
            let sum = limiter_tests::tcp::tcp_checksum(src.into(), dst.into(), &f[34..]);
            f[50..52].copy_from_slice(&sum.to_be_bytes());
            f
        })
        .collect()
}

/// Send `frames` in turn out of [`A_IF`] (the calling thread's namespace)
/// for SECS; returns how many the kernel took.
fn send_flood(frames: &[Vec<u8>]) -> u64 {
    let name = std::ffi::CString::new(A_IF).unwrap();
    // SAFETY: plain libc calls on values this function owns; the
    // messages point into `frames` and `addr`, which outlive the calls.
    unsafe {
        let ifindex = libc::if_nametoindex(name.as_ptr());
        assert_ne!(ifindex, 0, "no {A_IF}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap();
        libc::setsockopt(fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, (&raw const one).cast(), len);
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap();
        addr.sll_ifindex = i32::try_from(ifindex).unwrap();
        addr.sll_halen = 6;
        let mut iov: Vec<libc::iovec> =
            frames.iter().map(|f| libc::iovec { iov_base: f.as_ptr() as *mut _, iov_len: f.len() }).collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                let mut m: libc::mmsghdr = std::mem::zeroed();
                m.msg_hdr.msg_name = (&raw mut addr).cast();
                m.msg_hdr.msg_namelen = u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap();
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        let (until, mut sent, mut at) = (std::time::Instant::now() + Duration::from_secs_f64(SECS), 0u64, 0usize);
        while std::time::Instant::now() < until {
            let n = libc::sendmmsg(fd, msgs[at..].as_mut_ptr(), BATCH, 0);
            // A full ring refuses the batch's rest: counted as not sent.
            sent += u64::try_from(n.max(0)).unwrap_or(0);
            at = (at + BATCH as usize) % FRAMES;
        }
        libc::close(fd);
        sent
    }
}

/// Nanoseconds the threads `pids` have run (`/proc/PID/schedstat`).
fn run_ns(pids: &[i32]) -> u64 {
    pids.iter()
        .map(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/schedstat")).expect("a NAPI thread's schedstat");
            s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).expect("run time in ns")
        })
        .sum()
}

fn one_row(rx: Rx, frames: &[Vec<u8>]) -> Row {
    let net = VethPair::new("st");
    net.a.ip(&format!("link set {A_IF} address 02:00:00:00:00:01"));
    net.b.ip(&format!("link set {B_IF} address 02:00:00:00:00:02"));
    let _listener = net.b.run_in(|| std::net::TcpListener::bind((B_ADDR, PORT)).expect("listen on the receiver"));
    let mut replies = DataPlane::open_bench(1024).expect("load the bench object");
    net.a.run_in(|| replies.attach_entry(programs::BENCH_DROP_FLOOD_REPLIES, A_IF, AttachMode::Native).unwrap());
    // Every prefix far under its allowance: what the limiter drops, its
    // out-of-state check drops.
    let mut xdp = kernel::open_bench(&kernel::config(gcra::MAX_RATE, 1 << 40, false, 24, 56), 1 << 16);
    let prog = match rx {
        Rx::Floor => programs::BASELINE_DROP,
        Rx::Limiter => programs::LIMITER,
        Rx::Kernel | Rx::Conntrack { .. } => programs::BENCH_PASS,
    };
    net.b.run_in(|| xdp.attach_entry(prog, B_IF, AttachMode::Native).expect("attach to vb"));
    receiver_on_cpu1(&net.b);
    let napi = napi_threads();
    if let Rx::Conntrack { loose } = rx {
        nft_invalid(&net.b, loose);
    }
    let dropped = |xdp: &DataPlane| match rx {
        Rx::Floor => veth_stat(&net.b, B_IF, "_xdp_drops"),
        Rx::Kernel => 0,
        Rx::Conntrack { .. } => nft_counter(&net.b, "inet bench"),
        Rx::Limiter => xdp.maps.totals().expect("read STATS").get(Reason::TcpOutOfState).packets,
    };
    let read = || (dropped(&xdp), veth_stat(&net.b, B_IF, "_xdp_packets"), net.b.nstat("TcpOutRsts"), run_ns(&napi));
    let perf = (profile::wanted() && matches!(rx, Rx::Floor | Rx::Limiter)).then(|| Recording::start(1));
    let c0 = read();
    let frames_sent = net.a.run_in(|| {
        pin_to_cpu(0, 0);
        send_flood(frames)
    });
    std::thread::sleep(Duration::from_millis(200));
    let c1 = read();
    let lines = (rx == Rx::Limiter).then(|| JitLines::of("limiter")).flatten();
    let profile = perf.map(|p| p.stop(c1.1 - c0.1, lines.as_ref())).unwrap_or_default();
    Row {
        rx,
        frames: frames_sent,
        dropped: c1.0 - c0.0,
        received: c1.1 - c0.1,
        rsts: c1.2 - c0.2,
        cpu_secs: (c1.3 - c0.3) as f64 / 1e9,
        profile,
    }
}

pub fn tcp_flood() {
    let frames = ack_frames();
    let rxs = [Rx::Floor, Rx::Kernel, Rx::Conntrack { loose: false }, Rx::Conntrack { loose: true }, Rx::Limiter];
    let mut runs: Vec<Vec<Row>> = rxs.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for (rx, row) in rxs.iter().zip(&mut runs) {
            row.push(one_row(*rx, &frames));
        }
    }
    // Each row's least disturbed round: other load only ever adds time.
    let rows: Vec<Row> = runs
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| a.ns().total_cmp(&b.ns()));
            r.swap_remove(0)
        })
        .collect();
    let (floor, nft, lim) = (rows[0].ns(), rows[2].ns(), rows[4].ns());
    println!(
        "out-of-state TCP flood over a veth pair: bare ACKs from random sources in 256 /24s to a listener on \
         {PORT}, {SECS} s a row, generator on CPU 0, receiver's NAPI thread on CPU 1, best of {ROUNDS} rounds"
    );
    let m = |n: u64| n as f64 / 1e6;
    println!(
        "{:<40} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>8} {:>7} {:>9} {:>7}",
        "receiver",
        "sent",
        "recvd",
        "dropped",
        "RSTs",
        "NAPI-s",
        "drops/CPUs",
        "ns/seg",
        "x nft",
        "above bare",
        "x nft"
    );
    for r in &rows {
        let above = r.ns() - floor;
        println!(
            "{:<40} {:>6.2}M {:>6.2}M {:>6.2}M {:>6.2}M {:>7.2} {:>9.2}M {:>8.0} {:>7.2} {:>10.0} {:>7}",
            r.rx.label(),
            m(r.frames),
            m(r.received),
            m(r.dropped),
            m(r.rsts),
            r.cpu_secs,
            r.dropped as f64 / r.cpu_secs.max(1e-9) / 1e6,
            r.ns(),
            nft / r.ns(),
            above,
            if r.rx == Rx::Floor { "-".into() } else { format!("{:.2}", (nft - floor) / above.max(1.0)) },
        );
    }
    println!(
        "ns/seg: the receiver's NAPI thread's run time per segment received; above bare: less the bare \
         XDP_DROP's (the veth's ring and the generator's socket buffer, which a NIC's driver does not pay)"
    );
    println!(
        "goal: the limiter's drops per CPU-second at least 3x nftables' ct state invalid drop (tcp_loose 0) -> \
         end to end {:.2}x, above the harness's floor {:.2}x: {}",
        nft / lim,
        (nft - floor) / (lim - floor).max(1.0),
        if nft >= 3.0 * lim {
            "met"
        } else if nft - floor >= 3.0 * (lim - floor) {
            "met above the floor only"
        } else {
            "NOT met"
        }
    );
    if profile::wanted() {
        profile::print("an out-of-state ACK flood", 1, &rows[0].profile, &rows[4].profile);
    }
}
