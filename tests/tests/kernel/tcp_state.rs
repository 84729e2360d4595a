//! Out-of-state TCP through the real program (injected clock): a segment
//! other than a plain SYN, to a port a listener of this host takes,
//! passes only if a socket holds its 4-tuple; anything else is dropped
//! as `tcp_out_of_state`, its charge given back. Ports nobody listens on
//! are never judged; an operator's `allow` outranks the check; shadow
//! mode counts and passes; `auto` engages on a flood and lets go after
//! it. The program asks the sockets of the namespace the test runs in
//! (BPF_PROG_TEST_RUN's loopback), so the sockets are on it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};

use limiter::policy::{
    Class, CostUnit, Criticality, Limit, Mode, Override, OverrideAction, Policy, Protocol, SynCookies, TcpState,
};
use limiter_common::{Reason, tcp_state};
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_TCP},
};

const T0: u64 = 5_000_000_000_000;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
const FIN_ACK: u8 = 0x11;
const PSH_ACK: u8 = 0x18;
const SYN: u8 = 0x02;

fn lim(rate: u64, burst: u64, mode: Mode) -> Limit {
    Limit { rate, burst, cost: CostUnit::Packets, mode, window: None }
}

/// A class of TCP to `ports` (rate 1, burst `burst`) judging state as
/// `state`; the default class off.
fn policy(ports: &[u16], burst: u64, state: TcpState) -> Policy {
    Policy {
        default: lim(1, 1, Mode::Enforce),
        tcp_state: TcpState::Off,
        classes: vec![Class {
            name: "web".into(),
            protocol: Protocol::Tcp,
            ports: ports.iter().map(|&p| (p, p)).collect(),
            source_ports: Vec::new(),
            syn: false,
            limit: lim(1, burst, Mode::Enforce),
            syn_cookies: SynCookies::Off,
            syn_rate: None,
            tcp_state: Some(state),
            criticality: Criticality::Default,
        }],
        new_sources: None,
        ..Policy::default()
    }
}

/// An IPv6 segment behind a destination options header, or (`fragment`)
/// behind a hop-by-hop header and a first fragment's header.
fn seg6_behind(src: SocketAddr, dst: SocketAddr, flags: u8, fragment: bool) -> Vec<u8> {
    const HOP: u8 = 0;
    const DEST: u8 = 60;
    const FRAG: u8 = 44;
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src.ip(), dst.ip()) else { unreachable!("IPv6") };
    let f = if fragment {
        Frame::eth(ETH_P_IPV6).ipv6(s, HOP).ext(FRAG, 0).frag6(IPPROTO_TCP, 0, true)
    } else {
        Frame::eth(ETH_P_IPV6).ipv6(s, DEST).ext(IPPROTO_TCP, 0)
    };
    f.tcp_ports(src.port(), dst.port(), flags).to_v6(d).bytes
}

/// An untagged IPv4 frame with one word of IPv4 options (NOPs) after its
/// header's first 20 bytes.
fn ip_options(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    assert_eq!(f[14], 0x45, "an IPv4 header without options");
    f[14] = 0x46;
    f.splice(34..34, [1u8; 4]);
    f
}

/// An untagged frame behind `tags` VLAN tags (802.1ad outside 802.1Q).
fn tagged(frame: &[u8], tags: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    for t in 0..tags {
        let tpid: u16 = if t + 1 < tags { 0x88a8 } else { 0x8100 };
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&(10 + t).to_be_bytes());
    }
    f.extend_from_slice(&frame[12..]);
    f
}

fn seg(src: SocketAddr, dst: SocketAddr, flags: u8) -> Vec<u8> {
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            Frame::eth(ETH_P_IP).ipv4(s, IPPROTO_TCP, 0, 0).tcp_ports(src.port(), dst.port(), flags).to_v4(d).bytes
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            Frame::eth(ETH_P_IPV6).ipv6(s, IPPROTO_TCP).tcp_ports(src.port(), dst.port(), flags).to_v6(d).bytes
        }
        _ => unreachable!("one family"),
    }
}

/// A listener and a connection to it: (listener, client, server's end).
fn connection(at: &str) -> (TcpListener, TcpStream, TcpStream) {
    let l = TcpListener::bind(at).unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (l, c, s)
}

/// A port no socket has: bound, then closed.
fn unused(at: &str) -> u16 {
    TcpListener::bind(at).unwrap().local_addr().unwrap().port()
}

#[test]
fn a_segment_no_socket_holds_is_dropped_and_one_a_connection_holds_passes() {
    let _alone = limiter_tests::alone(module_path!());
    let (l4, c4, _s4) = connection("127.0.0.1:0");
    let (l6, c6, _s6) = connection("[::1]:0");
    let (srv4, srv6) = (l4.local_addr().unwrap(), l6.local_addr().unwrap());
    let (cli4, cli6) = (c4.local_addr().unwrap(), c6.local_addr().unwrap());
    let nobody = unused("127.0.0.1:0");
    let stranger4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 4_444));
    let stranger6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 4_444));
    let mut l = kernel::open(&policy(&[srv4.port(), srv6.port(), nobody], 1_000, TcpState::Always).compile(1).unwrap());
    let seq = [
        ("the connection's ACK", seg(cli4, srv4, ACK), Reason::Admitted),
        ("the connection's data", seg(cli4, srv4, PSH_ACK), Reason::Admitted),
        ("its FIN", seg(cli4, srv4, FIN_ACK), Reason::Admitted),
        ("an ACK of no connection", seg(stranger4, srv4, ACK), Reason::TcpOutOfState),
        ("a RST of none", seg(stranger4, srv4, RST), Reason::TcpOutOfState),
        ("a FIN of none", seg(stranger4, srv4, FIN_ACK), Reason::TcpOutOfState),
        ("data of none", seg(stranger4, srv4, PSH_ACK), Reason::TcpOutOfState),
        ("a segment without flags", seg(stranger4, srv4, 0), Reason::TcpOutOfState),
        ("a SYN opens one: not judged", seg(stranger4, srv4, SYN), Reason::Admitted),
        (
            "to a port nobody listens on: not judged",
            seg(stranger4, SocketAddr::from((Ipv4Addr::LOCALHOST, nobody)), ACK),
            Reason::Admitted,
        ),
        ("IPv6: the connection's ACK", seg(cli6, srv6, ACK), Reason::Admitted),
        ("IPv6: an ACK of none", seg(stranger6, srv6, ACK), Reason::TcpOutOfState),
        ("IPv6: a RST of none", seg(stranger6, srv6, RST), Reason::TcpOutOfState),
        // Read behind IPv4 options and VLAN tags as the parse reads.
        ("IPv4 options: the connection's ACK", ip_options(&seg(cli4, srv4, ACK)), Reason::Admitted),
        ("IPv4 options: an ACK of none", ip_options(&seg(stranger4, srv4, ACK)), Reason::TcpOutOfState),
        ("IPv4 options: data of none", ip_options(&seg(stranger4, srv4, PSH_ACK)), Reason::TcpOutOfState),
        ("one VLAN tag: the connection's ACK", tagged(&seg(cli4, srv4, ACK), 1), Reason::Admitted),
        ("one VLAN tag: an ACK of none", tagged(&seg(stranger4, srv4, ACK), 1), Reason::TcpOutOfState),
        ("two tags and options: the connection's data", tagged(&ip_options(&seg(cli4, srv4, PSH_ACK)), 2), Reason::Admitted),
        ("two tags and options: a RST of none", tagged(&ip_options(&seg(stranger4, srv4, RST)), 2), Reason::TcpOutOfState),
        ("two tags, IPv6: an ACK of none", tagged(&seg(stranger6, srv6, ACK), 2), Reason::TcpOutOfState),
        // Read behind IPv6 extension headers as the parse walks them.
        ("IPv6, a destination option: the connection's ACK", seg6_behind(cli6, srv6, ACK, false), Reason::Admitted),
        ("IPv6, a destination option: an ACK of none", seg6_behind(stranger6, srv6, ACK, false), Reason::TcpOutOfState),
        (
            "IPv6, hop-by-hop and a first fragment: data of none",
            seg6_behind(stranger6, srv6, PSH_ACK, true),
            Reason::TcpOutOfState,
        ),
        ("IPv6, hop-by-hop and a first fragment: the connection's data", seg6_behind(cli6, srv6, PSH_ACK, true), Reason::Admitted),
    ];
    for (what, f, want) in &seq {
        assert_eq!(kernel::reason_at(&mut l, T0, f), *want, "{what}");
    }
    // Counted once each, under the class.
    let c = l.maps.class_totals().unwrap();
    let dropped = seq.iter().filter(|s| s.2 == Reason::TcpOutOfState).count() as u64;
    assert_eq!(c[1].dropped.packets, dropped, "the class's drops");
    assert_eq!(l.maps.totals().unwrap().get(Reason::TcpOutOfState).packets, dropped);
    // With the check off, the same segments pass.
    let mut off = kernel::open(&policy(&[srv4.port()], 1_000, TcpState::Off).compile(2).unwrap());
    assert_eq!(kernel::reason_at(&mut off, T0, &seg(stranger4, srv4, ACK)), Reason::Admitted);
}

/// A flood of segments from a real user's prefix spends none of that
/// user's allowance: each drop's charge is given back.
#[test]
fn out_of_state_segments_spend_no_allowance_of_their_prefix() {
    let _alone = limiter_tests::alone(module_path!());
    let (l4, c4, _s4) = connection("127.0.0.1:0");
    let (srv, cli) = (l4.local_addr().unwrap(), c4.local_addr().unwrap());
    let mut l = kernel::open(&policy(&[srv.port()], 5, TcpState::Always).compile(1).unwrap());
    for i in 0..1_000u16 {
        let spoofed = SocketAddr::from((Ipv4Addr::LOCALHOST, 10_000 + i));
        assert_eq!(kernel::reason_at(&mut l, T0, &seg(spoofed, srv, ACK)), Reason::TcpOutOfState, "segment {i}");
    }
    // The prefix's burst of 5 is whole for the user's own segments.
    for i in 0..5 {
        assert_eq!(kernel::reason_at(&mut l, T0, &seg(cli, srv, PSH_ACK)), Reason::Admitted, "the user's {i}");
    }
    assert_eq!(kernel::reason_at(&mut l, T0, &seg(cli, srv, PSH_ACK)), Reason::RateLimited, "past the burst");
}

#[test]
fn an_operators_allow_outranks_it_and_shadow_mode_passes_what_it_would_drop() {
    let _alone = limiter_tests::alone(module_path!());
    let (l4, _c4, _s4) = connection("127.0.0.1:0");
    let srv = l4.local_addr().unwrap();
    let stranger = SocketAddr::from((Ipv4Addr::LOCALHOST, 4_444));
    let mut p = policy(&[srv.port()], 1_000, TcpState::Always);
    p.overrides =
        vec![Override { net: "127.0.0.0/24".parse().unwrap(), action: OverrideAction::Allow, criticality: None }];
    let mut allowed = kernel::open(&p.compile(1).unwrap());
    assert_eq!(kernel::reason_at(&mut allowed, T0, &seg(stranger, srv, ACK)), Reason::Allowed);
    let mut p = policy(&[srv.port()], 1_000, TcpState::Always);
    p.classes[0].limit.mode = Mode::Shadow;
    let mut shadow = kernel::open(&p.compile(2).unwrap());
    assert_eq!(kernel::reason_at(&mut shadow, T0, &seg(stranger, srv, ACK)), Reason::ShadowDropped);
}

/// `auto`: out-of-state segments pass until a period's probes estimate
/// more than the threshold; then the check engages, and it lets go once
/// the flood has been over for its hold.
#[test]
fn auto_engages_on_a_flood_and_lets_go_after_it() {
    let _alone = limiter_tests::alone(module_path!());
    let (l4, _c4, _s4) = connection("127.0.0.1:0");
    let srv = l4.local_addr().unwrap();
    let mut l = kernel::open(&policy(&[srv.port()], 1_000_000, TcpState::Auto).compile(1).unwrap());
    let spoofed = |i: u32| SocketAddr::from((Ipv4Addr::from(0x7f00_0000 | (i & 0xff_ffff)), 2_000 + (i % 50_000) as u16));
    let at = |i: u32| T0 + u64::from(i) * 1_000;
    // A few stray segments (a closed connection's, a scan): never engaged.
    for i in 0..20 {
        assert_eq!(kernel::reason_at(&mut l, at(i), &seg(spoofed(i), srv, ACK)), Reason::Admitted, "stray {i}");
    }
    // A flood: 5,000 segments within a period; passed until the probes
    // trip the trigger, refused after.
    let mut first = None;
    for i in 20..5_020 {
        if kernel::reason_at(&mut l, at(i), &seg(spoofed(i), srv, ACK)) == Reason::TcpOutOfState && first.is_none() {
            first = Some(i - 20);
        }
    }
    let first = first.expect("auto engaged during the flood");
    // The trigger needs PER_PERIOD estimated (one probe counts
    // PROBE_ONE_IN): a few probes, each drawn one in 64.
    let least = tcp_state::PER_PERIOD / tcp_state::PROBE_ONE_IN;
    assert!(u64::from(first) >= least, "engaged after {first} segments");
    assert!(first < 2_000, "engaged only after {first} segments");
    let t = at(5_020);
    assert_eq!(kernel::reason_at(&mut l, t, &seg(spoofed(1), srv, ACK)), Reason::TcpOutOfState, "engaged");
    // The hold: still engaged just before it ends, released after.
    let hold_ns = tcp_state::HOLD >> 4;
    assert_eq!(kernel::reason_at(&mut l, t + hold_ns / 2, &seg(spoofed(2), srv, ACK)), Reason::TcpOutOfState);
    let after = t + hold_ns / 2 + hold_ns + 1_000_000_000;
    assert_eq!(kernel::reason_at(&mut l, after, &seg(spoofed(3), srv, ACK)), Reason::Admitted, "released");
}

/// A connection made by a SYN cookie has no socket until its ACK (or a
/// later segment with it) reaches the kernel: such a segment to a
/// listener passes when the kernel's helper accepts its cookie, and only
/// then. The prefix holds a bucket in the SYN's class, so the cookie path
/// itself lets the ACK by to be charged.
#[test]
fn a_syn_cookies_ack_to_a_listener_passes_and_a_forged_one_does_not() {
    use limiter_tests::tcp::{Seg, ack_of};
    let _alone = limiter_tests::alone(module_path!());
    let _listener = TcpListener::bind("0.0.0.0:443").expect("port 443 free for the test's listener");
    let mut p = limiter_tests::tcp::policy(SynCookies::Always, None, None);
    p.tcp_state = TcpState::Always;
    let mut l = kernel::open(&p.compile(1).unwrap());
    let syn = Seg::syn("198.18.7.9".parse().unwrap(), 0);
    let at = |ms: u64| T0 + ms * 1_000_000;
    // The first SYN to a port goes to the kernel, the next gets a cookie.
    assert_eq!(kernel::reason_at(&mut l, at(0), &syn.bytes()), Reason::SynCookieToKernel);
    let (action, out) = l.run_out(at(1), &syn.bytes()).unwrap();
    assert_eq!(action, 3, "a cookie SYN-ACK (XDP_TX)");
    let cookie = u32::from_be_bytes(out[14 + 20 + 4..14 + 20 + 8].try_into().unwrap());
    assert_eq!(kernel::reason_at(&mut l, at(2), &ack_of(&syn, cookie).bytes()), Reason::SynCookieVerified);
    // Its prefix has a bucket now: the same ACK again is charged, judged,
    // and passes on its cookie; data with it too; a forged cookie, a RST
    // and a FIN of no connection do not.
    let data = Seg { flags: 0x18, ..ack_of(&syn, cookie) };
    let forged = ack_of(&syn, cookie ^ 0x0100_0000);
    let seq = [
        ("the cookie's ACK", ack_of(&syn, cookie), Reason::Admitted),
        ("data carrying it", data, Reason::Admitted),
        ("a forged cookie", forged.clone(), Reason::TcpOutOfState),
        ("a RST", Seg { flags: 0x04, ..forged.clone() }, Reason::TcpOutOfState),
        ("a FIN without ACK", Seg { flags: 0x01, ..forged }, Reason::TcpOutOfState),
    ];
    for (what, seg, want) in seq {
        assert_eq!(kernel::reason_at(&mut l, at(3), &seg.bytes()), want, "{what}");
    }
    // Behind IPv4 options the cookie is read as well: a forged one is not
    // let by for its options.
    let with_options = ip_options(&ack_of(&syn, cookie).bytes());
    assert_eq!(kernel::reason_at(&mut l, at(4), &with_options), Reason::Admitted, "the cookie's ACK, IPv4 options");
    let forged = ip_options(&ack_of(&syn, cookie ^ 0x0100_0000).bytes());
    assert_eq!(kernel::reason_at(&mut l, at(4), &forged), Reason::TcpOutOfState, "a forged cookie, IPv4 options");
}

/// The kernel's own SYN cookies, with the policy sending none: the
/// kernel (`tcp_syncookies = 2`, in a network namespace of the test's
/// thread) answers a SYN with a cookie; the client's ACK of it, and data
/// carrying it, pass (the kernel's check, asked of the listener); a
/// forged cookie does not, nor the same ACK to a listener that sent no
/// cookie lately.
#[test]
fn the_kernels_own_cookies_ack_passes_without_xdp_cookies() {
    use limiter_tests::tcp::{Seg, ack_of};
    let _alone = limiter_tests::alone(module_path!());
    let compiled = policy(&[443, 444], 1_000, TcpState::Always).compile(1).unwrap();
    assert_eq!(compiled.config.flags & limiter_common::flags::SYN_COOKIES, 0, "the policy sends no cookie");
    let mut l = kernel::open(&compiled);
    std::thread::scope(|s| {
        s.spawn(|| {
            own_namespace();
            let _cookies = TcpListener::bind("127.0.0.1:443").unwrap();
            let _quiet = TcpListener::bind("127.0.0.1:444").unwrap();
            let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
            let syn = Seg { dst: local, ..Seg::syn(local, 0) };
            let cookie = kernel_cookie_for(&syn);
            let at = |ms: u64| T0 + ms * 1_000_000;
            let data = Seg { flags: PSH_ACK, ..ack_of(&syn, cookie) };
            let forged = ack_of(&syn, cookie ^ 0x0100_0000);
            for (what, seg, want) in [
                ("the cookie's ACK", ack_of(&syn, cookie).bytes(), Reason::Admitted),
                ("data carrying it", data.bytes(), Reason::Admitted),
                ("a forged cookie", forged.bytes(), Reason::TcpOutOfState),
                // The cookie is read behind IPv4 options too.
                ("the cookie's ACK with IPv4 options", ip_options(&ack_of(&syn, cookie).bytes()), Reason::Admitted),
                ("a forged cookie with IPv4 options", ip_options(&forged.bytes()), Reason::TcpOutOfState),
            ] {
                assert_eq!(kernel::reason_at(&mut l, at(1), &seg), want, "{what}");
            }
            // Port 444's listener sent no cookie: the same numbers there
            // are out of state.
            let mut other = ack_of(&syn, cookie).bytes();
            other[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&444u16.to_be_bytes());
            let sum = limiter_tests::tcp::tcp_checksum(local, local, &{
                let mut t = other[34..].to_vec();
                t[16..18].fill(0);
                t
            });
            other[34 + 16..34 + 18].copy_from_slice(&sum.to_be_bytes());
            assert_eq!(kernel::reason_at(&mut l, at(2), &other), Reason::TcpOutOfState, "a quiet listener");
        });
    });
}

/// Move the calling thread into a network namespace of its own, loopback
/// up, where the kernel answers every SYN with a cookie.
fn own_namespace() {
    // SAFETY: unshare affects only this thread; the ioctls read and write
    // an ifreq this function owns on a socket it closes.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNET), 0, "unshare: {}", std::io::Error::last_os_error());
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo") {
            *d = libc::c_char::try_from(*s).unwrap();
        }
        assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &raw mut ifr), 0);
        ifr.ifr_ifru.ifru_flags |= libc::c_short::try_from(libc::IFF_UP).unwrap();
        assert_eq!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &raw mut ifr), 0, "lo up");
        libc::close(fd);
    }
    // /proc/sys/net is the namespace of the task that looks it up.
    std::fs::write("/proc/sys/net/ipv4/tcp_syncookies", "2").expect("tcp_syncookies = 2 in the thread's namespace");
}

/// Send `syn` (IPv4, to a local listener) through a raw socket and
/// return the sequence number of the SYN-ACK the kernel answers with.
fn kernel_cookie_for(syn: &limiter_tests::tcp::Seg) -> u32 {
    let packet = syn.bytes()[14..].to_vec();
    // SAFETY: a raw socket this function owns and closes; the buffers
    // outlive each call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap();
        libc::setsockopt(fd, libc::IPPROTO_IP, libc::IP_HDRINCL, (&raw const one).cast(), len);
        let tv = libc::timeval { tv_sec: 2, tv_usec: 0 };
        let tlen = libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap();
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&raw const tv).cast(), tlen);
        let mut to: libc::sockaddr_in = std::mem::zeroed();
        to.sin_family = libc::sa_family_t::try_from(libc::AF_INET).unwrap();
        to.sin_addr.s_addr = u32::from(Ipv4Addr::LOCALHOST).to_be();
        let addr_len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap();
        let sent = libc::sendto(fd, packet.as_ptr().cast(), packet.len(), 0, (&raw const to).cast(), addr_len);
        assert_eq!(usize::try_from(sent).ok(), Some(packet.len()), "send the SYN");
        // Our SYN comes back too; the SYN-ACK is from port 443.
        let mut buf = [0u8; 2048];
        for _ in 0..20 {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            let Ok(n) = usize::try_from(n) else { break };
            let t = usize::from(buf[0] & 0x0f) * 4;
            if n >= t + 20 && buf[t..t + 2] == 443u16.to_be_bytes() && buf[t + 13] & 0x12 == 0x12 {
                libc::close(fd);
                return u32::from_be_bytes(buf[t + 4..t + 8].try_into().unwrap());
            }
        }
        libc::close(fd);
    }
    panic!("no SYN-ACK from the listener within 20 packets or 2 s");
}
