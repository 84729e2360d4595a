//! SYN cookies through the compiled program (BPF_PROG_TEST_RUN): the
//! SYN-ACK built in XDP is checked field by field against the protocols'
//! layout (checksums recomputed here), and its cookie is checked by the
//! kernel's own helper when the client's ACK comes back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use limiter::policy::SynCookies;
use limiter_common::{BucketKey, Reason, cookie, family};
use limiter_tests::{
    kernel,
    tcp::{CLIENT_MAC, ISN, SERVER_MAC, SPORT, Seg, ack_of, checksum, policy, tcp_checksum},
};

const T0: u64 = 9_000_000_000_000;
const MS: u64 = 1_000_000;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

fn key(src: IpAddr, class: u8) -> BucketKey {
    match src {
        IpAddr::V4(a) => {
            let o = a.octets();
            BucketKey {
                family: family::IPV4,
                prefix_len: 24,
                class,
                pad: 0,
                addr: [u32::from_ne_bytes([o[0], o[1], o[2], 0]), 0],
            }
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            let mut hi = [0u8; 8];
            hi[..7].copy_from_slice(&o[..7]);
            BucketKey {
                family: family::IPV6,
                prefix_len: 56,
                class,
                pad: 0,
                addr: [
                    u32::from_ne_bytes(hi[..4].try_into().unwrap()),
                    u32::from_ne_bytes(hi[4..].try_into().unwrap()),
                ],
            }
        }
    }
}

/// The reason one frame is counted under, with the action and output.
fn run(l: &mut limiter::dataplane::DataPlane, now: u64, frame: &[u8]) -> (Reason, u32, Vec<u8>) {
    let before = l.maps.totals().unwrap();
    let (action, out) = l.run_out(now, frame).unwrap();
    let delta = l.maps.totals().unwrap().since(&before);
    let r = Reason::ALL.into_iter().find(|r| delta.get(*r).packets == 1).expect("one reason counted");
    (r, action, out)
}

/// Check the SYN-ACK's every field against the SYN it answers, its TCP
/// header `tcp_len` bytes long (24: the MSS option only; the options
/// beyond it are the caller's to check); return the cookie (its sequence
/// number).
fn check_synack(syn: &Seg, out: &[u8], tcp_len: usize) -> u32 {
    let l3 = 14 + 4 * syn.vlans;
    let v6 = syn.src.is_ipv6();
    let l4 = l3 + if v6 { 40 } else { 20 };
    assert_eq!(out.len(), l4 + tcp_len, "Ethernet, tags, IP and a {tcp_len}-byte TCP header");
    assert_eq!(out[..6], CLIENT_MAC, "to the client's MAC");
    assert_eq!(out[6..12], SERVER_MAC, "from ours");
    for t in 0..syn.vlans {
        assert_eq!(out[12 + 4 * t..16 + 4 * t], [0x81, 0x00, 0x00, 0x07], "VLAN tag {t} kept");
    }
    let ip = &out[l3..l4];
    let (s, d) = if v6 {
        assert_eq!(out[l3 - 2..l3], [0x86, 0xdd]);
        assert_eq!(ip[..4], [0x60, 0, 0, 0], "version 6, no class or flow label");
        assert_eq!(usize::from(u16::from_be_bytes([ip[4], ip[5]])), tcp_len, "payload length");
        assert_eq!((ip[6], ip[7]), (6, 64), "next header TCP, hop limit 64");
        let a = |o: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[o..o + 16]).unwrap()));
        (a(8), a(24))
    } else {
        assert_eq!(out[l3 - 2..l3], [0x08, 0x00]);
        assert_eq!(ip[0], 0x45, "IPv4 without options");
        assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), 20 + tcp_len, "total length");
        assert_eq!(ip[6..8], [0x40, 0], "don't fragment");
        assert_eq!((ip[8], ip[9]), (64, 6), "TTL 64, TCP");
        assert_eq!(checksum(ip, 0), 0, "IPv4 header checksum");
        let a = |o: usize| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&ip[o..o + 4]).unwrap()));
        (a(12), a(16))
    };
    assert_eq!((s, d), (syn.dst, syn.src), "addresses swapped");
    let tcp = &out[l4..];
    assert_eq!(u16::from_be_bytes([tcp[0], tcp[1]]), 443, "source port");
    assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), SPORT, "destination port");
    assert_eq!(u32::from_be_bytes(tcp[8..12].try_into().unwrap()), ISN.wrapping_add(1), "acknowledges the SYN");
    assert_eq!(usize::from(tcp[12] >> 4) * 4, tcp_len, "data offset");
    assert_eq!(tcp[12] & 0x0f, 0, "reserved bits");
    assert_eq!(tcp[13], 0x12, "SYN and ACK");
    // The cookie encodes the largest MSS of the kernel's table (IPv4:
    // 536, 1300, 1440, 1460; IPv6: 1220, 1420, 1440, 8940) not above the
    // client's 1460; the window is ten of those.
    let cookie_mss = if v6 { 1440 } else { 1460 };
    assert_eq!(u16::from_be_bytes([tcp[14], tcp[15]]), cookie::synack_window(cookie_mss), "window");
    let mss = if v6 { 1440u16 } else { 1460 }.to_be_bytes();
    assert_eq!(tcp[20..24], [2, 4, mss[0], mss[1]], "MSS option");
    assert_eq!(tcp_checksum(s, d, tcp), 0, "TCP checksum");
    u32::from_be_bytes(tcp[4..8].try_into().unwrap())
}

#[test]
fn a_new_prefix_gets_a_cookie_syn_ack_and_only_a_valid_ack_gets_it_a_bucket() {
    let _alone = limiter_tests::alone(module_path!());
    let layouts: [(&str, usize); 4] =
        [("198.18.7.9", 0), ("198.18.7.9", 1), ("2001:2:0:77::9", 0), ("2001:2:0:77::9", 2)];
    for (addr, vlans) in layouts {
        let what = format!("{addr} with {vlans} VLAN tags");
        let mut l = kernel::open(&policy(SynCookies::Always, None, None).compile(1).unwrap());
        let syn = Seg::syn(addr.parse().unwrap(), vlans);
        // The first SYN to a port goes to the kernel's own cookie path.
        let (r, action, _) = run(&mut l, T0, &syn.bytes());
        assert_eq!((r, action), (Reason::SynCookieToKernel, XDP_PASS), "{what}");
        let (r, action, out) = run(&mut l, T0 + MS, &syn.bytes());
        assert_eq!((r, action), (Reason::SynCookieSent, XDP_TX), "{what}");
        let c = check_synack(&syn, &out, 24);
        assert_eq!(l.bucket(&key(syn.src, 1)).unwrap(), None, "{what}: a SYN stores nothing");
        assert_eq!(l.tracked(), 0, "{what}");

        // An ACK with another cookie: dropped, still nothing stored.
        let (r, action, _) = run(&mut l, T0 + 2 * MS, &ack_of(&syn, c ^ 0x0100_0000).bytes());
        assert_eq!((r, action), (Reason::SynCookieInvalid, XDP_DROP), "{what}");
        assert_eq!(l.tracked(), 0, "{what}");
        // The same cookie from another prefix does not prove that one.
        let other: IpAddr =
            if syn.src.is_ipv6() { "2001:2:0:88::9".parse().unwrap() } else { "198.18.8.9".parse().unwrap() };
        let stolen = Seg { src: other, ..ack_of(&syn, c) };
        assert_eq!(run(&mut l, T0 + 2 * MS, &stolen.bytes()).0, Reason::SynCookieInvalid, "{what}");
        // The ACK of the SYN-ACK: the kernel's helper accepts the cookie,
        // and the prefix gets a bucket in the SYN's class.
        let (r, action, _) = run(&mut l, T0 + 3 * MS, &ack_of(&syn, c).bytes());
        assert_eq!((r, action), (Reason::SynCookieVerified, XDP_PASS), "{what}");
        assert!(l.bucket(&key(syn.src, 1)).unwrap().is_some(), "{what}: proven prefix has a bucket");
        assert_eq!(l.tracked(), 1, "{what}");
        // From now on its SYNs are charged to that bucket as any packet.
        let (r, action, _) = run(&mut l, T0 + 4 * MS, &syn.bytes());
        assert_eq!((r, action), (Reason::Admitted, XDP_PASS), "{what}");
        // And its ACKs pass the cookie check by.
        assert_eq!(run(&mut l, T0 + 5 * MS, &ack_of(&syn, 7).bytes()).0, Reason::Admitted, "{what}");
    }
}

#[test]
fn without_cookies_or_for_other_ports_syns_are_charged_as_before() {
    let _alone = limiter_tests::alone(module_path!());
    let syn = Seg::syn("198.18.7.9".parse().unwrap(), 0);
    let mut l = kernel::open(&policy(SynCookies::Off, None, None).compile(1).unwrap());
    assert_eq!(run(&mut l, T0, &syn.bytes()).0, Reason::Admitted);
    assert_eq!(run(&mut l, T0, &ack_of(&syn, 7).bytes()).0, Reason::Admitted);
    // IPv4 with options is outside what the SYN-ACK builder rewrites: charged.
    let mut l = kernel::open(&policy(SynCookies::Always, None, None).compile(1).unwrap());
    let mut f = syn.bytes();
    f[14] = 0x46;
    f.splice(34..34, [1, 1, 1, 1]);
    assert_eq!(run(&mut l, T0, &f).0, Reason::Admitted);
}

#[test]
fn auto_engages_above_the_syn_rate_or_when_the_budget_refuses_and_lets_go_after_the_hold() {
    let _alone = limiter_tests::alone(module_path!());
    let hold_ns = cookie::HOLD >> 4;
    let new_syn = |i: u8| Seg::syn(IpAddr::V4(Ipv4Addr::new(198, 18, 100 + i, 1)), 0).bytes();
    // 40 SYNs/s from new sources = 10 per 250 ms period.
    let mut l = kernel::open(&policy(SynCookies::Auto, Some(40), None).compile(1).unwrap());
    let got: Vec<Reason> = (0..14).map(|i| run(&mut l, T0 + u64::from(i), &new_syn(i)).0).collect();
    assert_eq!(got[..10], [Reason::Admitted; 10], "{got:?}");
    assert_eq!(
        got[10..],
        [Reason::SynCookieToKernel, Reason::SynCookieSent, Reason::SynCookieSent, Reason::SynCookieSent]
    );
    // Engaged for the hold after the last period that tripped it (more
    // than a second on: the first SYN goes to the kernel again)...
    assert_eq!(run(&mut l, T0 + hold_ns - 2 * MS, &new_syn(20)).0, Reason::SynCookieToKernel);
    assert_eq!(run(&mut l, T0 + hold_ns - MS, &new_syn(22)).0, Reason::SynCookieSent);
    // ...then off: a new source's SYN gets a bucket again.
    assert_eq!(run(&mut l, T0 + hold_ns + 300 * MS, &new_syn(21)).0, Reason::Admitted);

    // A budget of one new source per second: the second new source's SYN
    // is refused by it, which engages cookies and answers that SYN.
    let mut l = kernel::open(&policy(SynCookies::Auto, Some(10_000), Some((1, 1))).compile(1).unwrap());
    let got: Vec<Reason> = (0..3).map(|i| run(&mut l, T0, &new_syn(i)).0).collect();
    assert_eq!(got, [Reason::Admitted, Reason::SynCookieToKernel, Reason::SynCookieSent]);
}

/// A case of the options test: its name, the SYN's options, the host's
/// opts, and what is offered back (SACK, window scale, timestamps).
type Case<'a> = (&'a str, &'a [u8], u8, bool, bool, bool);

/// `CLOCK_MONOTONIC` in ms: the kernel's TCP timestamp clock.
fn tcp_clock_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap() * 1000 + u64::try_from(ts.tv_nsec).unwrap() / 1_000_000
}

/// With `net.ipv4.tcp_timestamps = 2` (the daemon then sets `opts`), a SYN
/// that carries a timestamp gets SACK, timestamps and window scaling
/// offered back, laid out as the kernel lays them out, with the client's
/// window scale and SACK in the timestamp's low bits for the kernel to read
/// back; options in any order are found; without a timestamp, or where the
/// host turns an option off, less is offered; a malformed list ends the
/// walk.
#[test]
fn with_timestamps_the_syn_ack_offers_window_scale_sack_and_timestamps() {
    let _alone = limiter_tests::alone(module_path!());
    use limiter_common::cookie::opt;
    const WSCALE: u8 = 9;
    let mss = [2, 4, 0x05, 0xb4];
    let ts = [8, 10, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0];
    let linux: Vec<u8> = [&mss[..], &[4, 2], &ts, &[1, 3, 3, 7]].concat();
    let macos: Vec<u8> = [&mss[..], &[1, 3, 3, 7, 1, 1], &ts, &[4, 2, 0, 0]].concat();
    let no_sack: Vec<u8> = [&mss[..], &[1, 1], &ts, &[1, 3, 3, 7]].concat();
    let no_ts: Vec<u8> = [&mss[..], &[1, 3, 3, 7, 4, 2, 1, 1]].concat();
    let broken: Vec<u8> = [&mss[..], &[9, 0, 1, 1], &ts, &[1, 3, 3, 7]].concat();
    let all = opt::TIMESTAMPS | opt::SACK | opt::WSCALE;
    // (options, the host's opts, expected: SACK, window scale, timestamps)
    let cases: [Case; 7] = [
        ("linux", &linux, all, true, true, true),
        ("macos", &macos, all, true, true, true),
        ("no sack from the client", &no_sack, all, false, true, true),
        ("no timestamp from the client", &no_ts, all, false, false, false),
        ("malformed after the MSS", &broken, all, false, false, false),
        ("the host without SACK or window scaling", &linux, opt::TIMESTAMPS, false, false, true),
        ("the host with tcp_timestamps = 1", &linux, 0, false, false, false),
    ];
    for addr in ["198.18.7.9", "2001:2:0:77::9"] {
        for (what, options, opts, sack, wscale, stamps) in cases {
            let what = format!("{addr}, {what}");
            let mut compiled = policy(SynCookies::Always, None, None).compile(1).unwrap();
            (compiled.config.cookies.opts, compiled.config.cookies.wscale) = (opts, WSCALE);
            let mut l = kernel::open(&compiled);
            let syn = Seg { options: options.to_vec(), ..Seg::syn(addr.parse().unwrap(), 1) };
            assert_eq!(run(&mut l, T0, &syn.bytes()).0, Reason::SynCookieToKernel, "{what}");
            let before = tcp_clock_ms();
            let (r, action, out) = run(&mut l, T0 + MS, &syn.bytes());
            let after = tcp_clock_ms();
            assert_eq!((r, action), (Reason::SynCookieSent, XDP_TX), "{what}");
            let tcp_len = 24 + if stamps { 12 } else { 0 } + if wscale { 4 } else { 0 };
            let c = check_synack(&syn, &out, tcp_len);
            let o = &out[out.len() - tcp_len + 24..];
            if stamps {
                assert_eq!(o[..2], if sack { [4, 2] } else { [1, 1] }, "{what}: SACK permitted, or two NOPs");
                assert_eq!(o[2..4], [8, 10], "{what}: timestamps");
                let tsval = u32::from_be_bytes(o[4..8].try_into().unwrap());
                assert_eq!(o[8..12], [0xaa, 0xbb, 0xcc, 0xdd], "{what}: echoes the client's value");
                let low = if wscale { 7 } else { 0xf } | if sack { 0x10 } else { 0 };
                assert_eq!(tsval & 0x3f, low, "{what}: window scale and SACK in the low bits");
                // The kernel's clock, at most 64 ms behind (its low bits replaced).
                let clock = u32::try_from(after % (1 << 32)).unwrap();
                let behind = u64::from(clock.wrapping_sub(tsval));
                assert!(behind < after - before + 64, "{what}: timestamp {tsval}, clock {clock}");
            }
            if wscale {
                assert_eq!(o[o.len() - 4..], [1, 3, 3, WSCALE], "{what}: NOP, our window scale");
            }
            // The kernel's helper takes the ACK (echoing the timestamp).
            let (r, _, _) = run(&mut l, T0 + 2 * MS, &ack_of(&syn, c).bytes());
            assert_eq!(r, Reason::SynCookieVerified, "{what}");
        }
    }
}

/// Trust boundaries: SYN+RST, SYN+FIN and a data offset under 5
/// are refused under a reason of their own before any state is touched
/// (with cookies or without: they used to be charged, so each made a
/// bucket and spent the new-source budget); while cookies are engaged, a
/// prefix without a bucket gets one only through a verified cookie (a RST,
/// a FIN, a SYN-ACK or a segment without flags used to be charged too).
#[test]
fn malformed_and_non_initial_tcp_never_make_state() {
    let _alone = limiter_tests::alone(module_path!());
    let src = |i: u8| IpAddr::V4(Ipv4Addr::new(198, 18, 100, i));
    for cookies in [SynCookies::Always, SynCookies::Off] {
        // A budget of 4 new sources (burst), refilled at 1/s.
        let mut l = kernel::open(&policy(cookies, None, Some((1, 4))).compile(1).unwrap());
        for (i, flags) in [0x06u8, 0x03, 0x07, 0x16, 0x13].into_iter().enumerate() {
            let seg = Seg { flags, ..Seg::syn(src(u8::try_from(i).unwrap()), 0) };
            let (r, action, _) = run(&mut l, T0 + MS * u64::try_from(i).unwrap(), &seg.bytes());
            assert_eq!((r, action), (Reason::TcpBadFlags, XDP_DROP), "{cookies:?}: flags {flags:#04x}");
        }
        // Data offset 4 (16 bytes): no TCP header a stack takes.
        let mut f = Seg { flags: 0x10, options: vec![], ..Seg::syn(src(9), 0) }.bytes();
        let l4 = f.len() - 20;
        f[l4 + 12] = 4 << 4;
        assert_eq!(run(&mut l, T0 + 10 * MS, &f).0, Reason::TcpBadFlags, "{cookies:?}: data offset 4");
        assert_eq!(l.tracked(), 0, "{cookies:?}: no bucket from any of them");
        // The budget is whole: a new source's SYN is admitted (without
        // cookies; it would be `new_source_limited` had the six above
        // spent the burst of 4) or answered as any (with them).
        let expect = if cookies == SynCookies::Off { Reason::Admitted } else { Reason::SynCookieToKernel };
        assert_eq!(run(&mut l, T0 + 11 * MS, &Seg::syn(src(20), 0).bytes()).0, expect, "{cookies:?}");
    }
    // Cookies engaged: every segment but a SYN or a valid cookie ACK from
    // a prefix without a bucket is refused and stores nothing.
    let mut l = kernel::open(&policy(SynCookies::Always, None, None).compile(1).unwrap());
    for (i, flags) in [0x04u8, 0x01, 0x00, 0x12, 0x14, 0x11, 0x08].into_iter().enumerate() {
        let seg = Seg { flags, options: vec![], ..Seg::syn(src(30 + u8::try_from(i).unwrap()), 0) };
        let (r, action, _) = run(&mut l, T0 + MS * u64::try_from(i).unwrap(), &seg.bytes());
        assert_eq!((r, action), (Reason::SynCookieInvalid, XDP_DROP), "flags {flags:#04x}");
    }
    assert_eq!(l.tracked(), 0);
}
