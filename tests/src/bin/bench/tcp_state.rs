//! `bench tcp-state`: what the out-of-state TCP check costs, on one
//! program whose config is switched between rounds (the same code and
//! maps measured): the admit path of a TCP segment of an established
//! connection with the check off (the plain admitted path), `auto` and not
//! engaged, and `always` (the connection found in the cache of held
//! connections); and an out-of-state drop beside a rate-limited drop of
//! the same segment.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};

use limiter_common::{Config, programs, tcp_state};
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_TCP},
};

use super::{REPEAT, ROUNDS, measure};

const ACK: u8 = 0x10;
const RST: u8 = 0x04;

/// A segment with `flags` from `src` to `dst` (IPv4).
fn seg(src: SocketAddr, dst: SocketAddr, flags: u8) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else { unreachable!("IPv4") };
    Frame::eth(ETH_P_IP).ipv4(s, IPPROTO_TCP, 0, 0).tcp_ports(src.port(), dst.port(), flags).payload(6).to_v4(d).bytes
}

/// `c` with the default class's check in mode `m`.
fn with(c: &Config, m: u8) -> Config {
    let mut c = *c;
    c.flags = c.flags & !tcp_state::bits(0, tcp_state::mode::AUTO) | tcp_state::bits(0, m);
    c
}

pub fn tcp_state() {
    // A real connection on loopback: BPF_PROG_TEST_RUN asks this
    // namespace's sockets.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let srv = listener.local_addr().unwrap();
    let client = TcpStream::connect(srv).unwrap();
    let (_server, _) = listener.accept().unwrap();
    let held = seg(client.local_addr().unwrap(), srv, ACK);
    let stranger = seg(SocketAddr::from(([127, 0, 0, 1], 4_444)), srv, ACK);
    let reset = seg(SocketAddr::from(([127, 0, 0, 1], 4_444)), srv, RST);

    let admit = kernel::config(limiter_common::gcra::MAX_RATE, 1 << 40, false, 24, 56).config;
    let refuse = with(&kernel::config(1, 1, false, 24, 56).config, tcp_state::mode::OFF);
    let mut l = kernel::open_bench(&kernel::config(limiter_common::gcra::MAX_RATE, 1 << 40, false, 24, 56), 1024);
    l.load_program(programs::LIMITER).unwrap();
    l.test_run(programs::LIMITER, &held, 1).unwrap();
    let admits = [tcp_state::mode::OFF, tcp_state::mode::AUTO, tcp_state::mode::ALWAYS].map(|m| with(&admit, m));
    // Each config written as a new policy version, as the daemon writes
    // one: a refusal this CPU cached under one is not used under the next.
    let mut version = admit.version;
    let mut apply = |l: &mut limiter::dataplane::DataPlane, cfg: &Config| {
        version += 1;
        l.apply_config(&Config { version, ..*cfg }).expect("write CONFIG");
    };
    let mut rows: [Vec<f64>; 6] = Default::default();
    for _ in 0..ROUNDS {
        for (cfg, row) in admits.iter().zip(&mut rows) {
            apply(&mut l, cfg);
            // The drops below engage `auto` for its hold: measured idle.
            l.maps.counters.release_tcp_state(0).expect("write TCP_GUARD");
            row.push(measure(&mut l, programs::LIMITER, &held, kernel::XDP_PASS));
        }
        apply(&mut l, &admits[2]);
        rows[3].push(measure(&mut l, programs::LIMITER, &stranger, kernel::XDP_DROP));
        rows[5].push(measure(&mut l, programs::LIMITER, &reset, kernel::XDP_DROP));
        apply(&mut l, &refuse);
        l.test_run(programs::LIMITER, &stranger, 2).unwrap();
        rows[4].push(measure(&mut l, programs::LIMITER, &stranger, kernel::XDP_DROP));
    }
    let [off, idle, engaged, out_of_state, rate_limited, out_of_state_rst] = rows.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[0]
    });
    println!("BPF_PROG_TEST_RUN, {ROUNDS} interleaved rounds of {REPEAT} runs, a bare ACK of a connection on loopback");
    println!("{:<60} {:>10} {:>8}", "path", "ns/packet", "ratio");
    for (label, ns, base) in [
        ("admitted, check off (the plain admitted path)", off, off),
        ("admitted, check auto, not engaged", idle, off),
        ("admitted, check engaged (a held connection, cached)", engaged, off),
        ("rate-limited drop, check off", rate_limited, rate_limited),
        ("out-of-state drop, an ACK (its SYN cookie checked too)", out_of_state, rate_limited),
        ("out-of-state drop, a RST", out_of_state_rst, rate_limited),
    ] {
        println!("{label:<60} {ns:>10.1} {:>8.2}", ns / base);
    }
    let at_most = |x: f64, goal: f64| if x <= goal { "met" } else { "NOT met" };
    println!(
        "goal: a held connection's packet with the check engaged at most 1.15x the plain admitted path -> {} ({:.2}x); \
         not engaged at most 1.02x -> {} ({:.2}x); an out-of-state drop at most 1.2x a rate-limited drop -> {} (an ACK \
         {:.2}x, a RST {:.2}x)",
        at_most(engaged / off, 1.15),
        engaged / off,
        at_most(idle / off, 1.02),
        idle / off,
        at_most(out_of_state_rst.max(out_of_state) / rate_limited, 1.2),
        out_of_state / rate_limited,
        out_of_state_rst / rate_limited
    );
}
