//! `bench tunnel`: what forwarding at the driver costs a packet, beside
//! the plain admitted path of the same segment, on one program whose
//! config and maps are switched between rounds: tunnels on but the
//! packet to no service (the flag and a service-map miss), a packet
//! forwarded with IPIP and with GUE (its flow in the connection table:
//! the hash, the connection-table hit, the route lookup, the outer
//! headers), the same with the connection table full (262,144 flows),
//! and the ICMP answer to a packet too big once wrapped. In a namespace
//! of the bench's own whose route to the backends leaves by a veth with
//! static neighbours (BPF_PROG_TEST_RUN: the packets are not sent; a
//! call of one run each, see [`CALLS`], so these figures carry a call's
//! fixed overhead that `bench hit`'s do not: compare ratios within this
//! section).

use std::net::Ipv4Addr;

use limiter::dataplane::{
    DataPlane,
    xdp_action::{XDP_PASS, XDP_REDIRECT, XDP_TX},
};
use limiter_common::{
    flags, programs,
    tunnel::{Backend, CONNECTIONS, Service, ServiceKey, TABLE_SIZE, encap, state},
};
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_TCP},
    tunnel::{FIB_BACKENDS, fib_ns},
};

use super::ROUNDS;

/// BPF_PROG_TEST_RUN calls of one run each per row and round: a run that
/// wraps a packet leaves the frame wrapped (the kernel does not reset it
/// between the runs of one call, and live frames are refused here), so
/// every row is measured a call a run, the kernel's time of each summed.
const CALLS: u32 = 100_000;

/// The kernel's mean ns per run over [`CALLS`] calls of one run.
fn measure(l: &mut DataPlane, prog: &'static str, frame: &[u8], want: u32) -> f64 {
    let mut total = std::time::Duration::ZERO;
    for _ in 0..CALLS {
        let (action, d) = l.test_run(prog, frame, 1).expect("BPF_PROG_TEST_RUN");
        assert_eq!(action, want, "{prog}: unexpected action");
        total += d;
    }
    total.as_secs_f64() * 1e9 / f64::from(CALLS)
}

const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 100);

fn seg(src: Ipv4Addr, sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    Frame::eth(ETH_P_IP)
        .ipv4(src, IPPROTO_TCP, 0, 0x4000)
        .tcp_ports(sport, dport, 0x10)
        .payload(payload)
        .to_v4(VIP)
        .bytes
}

fn addr16(a: [u8; 4]) -> [u8; 16] {
    let mut o = [0; 16];
    o[..4].copy_from_slice(&a);
    o
}

fn service(encap: u8) -> Service {
    Service { index: 0, encap, flags: 0, ttl: 64, v6: 0, port: 5555, pad: 0, source: addr16([198, 19, 0, 1]) }
}

pub fn tunnel() {
    let (ns, _) = fib_ns();
    ns.run_in(run);
}

fn run() {
    let admit = kernel::config(limiter_common::gcra::MAX_RATE, 1 << 40, false, 24, 56).config;
    let tunnels = limiter_common::Config { flags: admit.flags | flags::TUNNELS, ..admit };
    let mut l: DataPlane =
        kernel::open_bench(&kernel::config(limiter_common::gcra::MAX_RATE, 1 << 40, false, 24, 56), 1024);
    l.load_program(programs::LIMITER).unwrap();
    let key = ServiceKey { addr: addr16(VIP.octets()), port: 80, proto: IPPROTO_TCP, v6: 0 };
    let backends: Vec<(u32, Backend)> = FIB_BACKENDS
        .iter()
        .enumerate()
        .map(|(i, b)| {
            (u32::try_from(i).unwrap(), Backend { addr: addr16(*b), state: state::UP, pad: [0; 3], service: 0 })
        })
        .collect();
    let table: Vec<u32> = (0..TABLE_SIZE).map(|i| i % 2).collect();
    l.set_tunnel(&[key], service(encap::IPIP), &backends, &table).unwrap();
    let src = Ipv4Addr::new(198, 18, 5, 10);
    let (to_service, to_other, too_big) =
        (seg(src, 40_000, 80, 6), seg(src, 40_000, 81, 6), seg(src, 40_001, 80, 1460));
    let mut version = admit.version;
    let mut apply = |l: &mut DataPlane, cfg: &limiter_common::Config| {
        version += 1;
        l.apply_config(&limiter_common::Config { version, ..*cfg }).expect("write CONFIG");
    };
    let mut rows: [Vec<f64>; 6] = Default::default();
    let mut full = false;
    for round in 0..ROUNDS {
        apply(&mut l, &admit);
        rows[0].push(measure(&mut l, programs::LIMITER, &to_service, XDP_PASS));
        apply(&mut l, &tunnels);
        rows[1].push(measure(&mut l, programs::LIMITER, &to_other, XDP_PASS));
        l.set_tunnel(&[key], service(encap::IPIP), &[], &table).unwrap();
        let ipip = measure(&mut l, programs::LIMITER, &to_service, XDP_REDIRECT);
        rows[if full { 4 } else { 2 }].push(ipip);
        l.set_tunnel(&[key], service(encap::GUE), &[], &table).unwrap();
        rows[3].push(measure(&mut l, programs::LIMITER, &to_service, XDP_REDIRECT));
        rows[5].push(measure(&mut l, programs::LIMITER, &too_big, XDP_TX));
        // Halfway, the connection table is filled: a flow each from
        // 262,144 source addresses and ports.
        if round == ROUNDS / 2 && !full {
            l.set_tunnel(&[key], service(encap::IPIP), &[], &table).unwrap();
            for i in 0..CONNECTIONS {
                let a = Ipv4Addr::from(0xc612_0000 | (i >> 4) & 0xffff);
                let f = seg(a, 1024 + u16::try_from(i & 0xf).unwrap(), 80, 6);
                l.test_run(programs::LIMITER, &f, 1).unwrap();
            }
            full = true;
        }
    }
    let [plain, other, ipip, gue, ipip_full, icmp] = rows.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v.first().copied().unwrap_or(f64::NAN)
    });
    println!(
        "BPF_PROG_TEST_RUN, {ROUNDS} interleaved rounds of {CALLS} calls of one run, a TCP segment to a tunnelled \
         service (IPv4), the fastest round of each"
    );
    println!("{:<64} {:>10} {:>8}", "path", "ns/packet", "ratio");
    for (label, ns) in [
        ("plain admitted (no tunnels in the policy)", plain),
        ("tunnels on, the packet to no service", other),
        ("forwarded, IPIP (its flow in the connection table)", ipip),
        ("forwarded, GUE", gue),
        ("forwarded, IPIP, connection table full (262,144 flows)", ipip_full),
        ("too big once wrapped: the ICMP answer", icmp),
    ] {
        println!("{label:<64} {ns:>10.1} {:>7.2}x", ns / plain);
    }
    println!("goal: forwarded at most 1.5x the plain admitted path");
}
