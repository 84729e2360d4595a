//! Kernel fixture suite: crafted frames through BPF_PROG_TEST_RUN on the
//! real object, as a table of (frame, expected action, expected reason),
//! with exact counter deltas; plus a truncation sweep at every byte offset.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{Reason, reason::MAX_IPV6_EXT_HEADERS};
use limiter_tests::{
    kernel::{self, XDP_DROP, XDP_PASS, assert_counted_once},
    packet::*,
};

const NOW: u64 = 1_000_000_000;

/// The documented verdict of each reason (docs/concepts.md, "Verdicts and reasons"),
/// written out here rather than taken from the code under test.
const XDP_TX: u32 = 3;

fn documented_action(r: Reason) -> u32 {
    match r {
        Reason::Admitted
        | Reason::NonIp
        | Reason::NoConfig
        | Reason::BucketInsertFailed
        | Reason::ShadowDropped
        | Reason::Allowed
        | Reason::SynCookieToKernel
        | Reason::SynCookieVerified
        | Reason::OwnAnswer => XDP_PASS,
        Reason::SynCookieSent => XDP_TX,
        Reason::RateLimited
        | Reason::Contended
        | Reason::EthTruncated
        | Reason::VlanTruncated
        | Reason::VlanDepthExceeded
        | Reason::Ipv4Truncated
        | Reason::Ipv4BadHeader
        | Reason::Ipv6Truncated
        | Reason::Ipv6BadHeader
        | Reason::Ipv6ExtTruncated
        | Reason::Ipv6ExtLimit
        | Reason::L4Truncated
        | Reason::Denied
        | Reason::NewSourceLimited
        | Reason::AggregateLimited
        | Reason::SynCookieInvalid
        | Reason::TcpBadFlags
        | Reason::GroupLimited
        | Reason::TcpOutOfState => XDP_DROP,
    }
}

fn v4(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 5, last)
}

fn v6() -> Ipv6Addr {
    "2001:2:0:100::1".parse().unwrap()
}

/// `n` extension headers of mixed kinds ending in `last_next`; the first is
/// hop-by-hop and a first fragment header sits in the middle.
fn ext_chain(n: usize, last_next: u8) -> Frame {
    let kinds = [
        NEXTHDR_HOP,
        NEXTHDR_DEST,
        NEXTHDR_ROUTING,
        NEXTHDR_FRAGMENT,
        NEXTHDR_AUTH,
        NEXTHDR_DEST,
        NEXTHDR_ROUTING,
        NEXTHDR_DEST,
        NEXTHDR_DEST,
    ];
    let mut f = Frame::eth(ETH_P_IPV6).ipv6(v6(), kinds[0]);
    for i in 0..n {
        let next = if i + 1 < n { kinds[(i + 1) % kinds.len()] } else { last_next };
        f = match kinds[i % kinds.len()] {
            NEXTHDR_FRAGMENT => f.frag6(next, 0, true),
            NEXTHDR_AUTH => f.auth(next, 2),
            k => f.ext(next, u8::try_from(i % 3).unwrap() + u8::from(k == NEXTHDR_ROUTING)),
        };
    }
    f
}

/// Headers the parser never reaches (past a walk limit) get the limit's reason
/// when cut: mark every layer after `keep` whole headers.
fn past_limit(mut f: Frame, keep: usize, r: Reason) -> Frame {
    for l in f.layers.iter_mut().skip(keep) {
        l.1 = r;
    }
    f
}

fn table() -> Vec<(&'static str, Frame, Reason)> {
    let ipv4_udp = || Frame::eth(ETH_P_IP).ipv4(v4(1), IPPROTO_UDP, 0, 0).udp().payload(18);
    vec![
        ("ipv4 udp", ipv4_udp(), Reason::Admitted),
        ("ipv4 tcp", Frame::eth(ETH_P_IP).ipv4(v4(2), IPPROTO_TCP, 0, 0).tcp(), Reason::Admitted),
        ("ipv4 icmp", Frame::eth(ETH_P_IP).ipv4(v4(2), IPPROTO_ICMP, 0, 0).payload(8), Reason::Admitted),
        ("ipv4 options (ihl 8)", Frame::eth(ETH_P_IP).ipv4(v4(3), IPPROTO_UDP, 3, 0).udp(), Reason::Admitted),
        ("ipv4 options (ihl 15)", Frame::eth(ETH_P_IP).ipv4(v4(3), IPPROTO_TCP, 10, 0).tcp(), Reason::Admitted),
        ("ipv4 ihl 4", Frame::eth(ETH_P_IP).ipv4_raw_vihl(0x44).payload(20), Reason::Ipv4BadHeader),
        ("ipv4 ihl 0", Frame::eth(ETH_P_IP).ipv4_raw_vihl(0x40).payload(20), Reason::Ipv4BadHeader),
        ("ipv4 version 6", Frame::eth(ETH_P_IP).ipv4_raw_vihl(0x65).payload(20), Reason::Ipv4BadHeader),
        (
            "ipv4 first fragment",
            Frame::eth(ETH_P_IP).ipv4(v4(4), IPPROTO_UDP, 0, 0x2000).udp().payload(8),
            Reason::Admitted,
        ),
        // Offset 1 (8 bytes), no L4 header at all: charged, not "truncated".
        (
            "ipv4 non-first fragment",
            Frame::eth(ETH_P_IP).ipv4(v4(4), IPPROTO_UDP, 0, 0x0001).payload(3),
            Reason::Admitted,
        ),
        ("ipv4 last fragment", Frame::eth(ETH_P_IP).ipv4(v4(4), IPPROTO_TCP, 0, 0x00b9), Reason::Admitted),
        ("ipv6 udp", Frame::eth(ETH_P_IPV6).ipv6(v6(), IPPROTO_UDP).udp().payload(4), Reason::Admitted),
        ("ipv6 tcp", Frame::eth(ETH_P_IPV6).ipv6(v6(), IPPROTO_TCP).tcp(), Reason::Admitted),
        ("ipv6 icmpv6", Frame::eth(ETH_P_IPV6).ipv6(v6(), IPPROTO_ICMPV6).payload(8), Reason::Admitted),
        (
            "ipv6 version 4",
            {
                // Nothing past a header with the wrong version is read.
                let mut f = past_limit(Frame::eth(ETH_P_IPV6).ipv6(v6(), IPPROTO_UDP).udp(), 2, Reason::Ipv6BadHeader);
                f.bytes[14] = 0x45;
                f
            },
            Reason::Ipv6BadHeader,
        ),
        ("ipv6 ext chain at the limit", ext_chain(MAX_IPV6_EXT_HEADERS, IPPROTO_TCP).tcp(), Reason::Admitted),
        (
            "ipv6 ext chain one past the limit",
            past_limit(
                ext_chain(MAX_IPV6_EXT_HEADERS + 1, IPPROTO_TCP).tcp(),
                2 + MAX_IPV6_EXT_HEADERS,
                Reason::Ipv6ExtLimit,
            ),
            Reason::Ipv6ExtLimit,
        ),
        (
            "ipv6 first fragment",
            Frame::eth(ETH_P_IPV6).ipv6(v6(), NEXTHDR_FRAGMENT).frag6(IPPROTO_UDP, 0, true).udp(),
            Reason::Admitted,
        ),
        (
            "ipv6 non-first fragment",
            Frame::eth(ETH_P_IPV6).ipv6(v6(), NEXTHDR_FRAGMENT).frag6(IPPROTO_TCP, 185, false).payload(5),
            Reason::Admitted,
        ),
        (
            "ipv6 hop-by-hop + udp",
            Frame::eth(ETH_P_IPV6).ipv6(v6(), NEXTHDR_HOP).ext(IPPROTO_UDP, 0).udp(),
            Reason::Admitted,
        ),
        (
            "802.1Q ipv4",
            Frame::eth(ETH_P_8021Q).vlan(7, ETH_P_IP).ipv4(v4(5), IPPROTO_UDP, 0, 0).udp(),
            Reason::Admitted,
        ),
        (
            "QinQ depth 2 ipv6",
            Frame::eth(ETH_P_8021AD).vlan(7, ETH_P_8021Q).vlan(8, ETH_P_IPV6).ipv6(v6(), IPPROTO_TCP).tcp(),
            Reason::Admitted,
        ),
        (
            "QinQ depth 3",
            past_limit(
                Frame::eth(ETH_P_8021AD)
                    .vlan(7, ETH_P_8021Q)
                    .vlan(8, ETH_P_8021Q)
                    .vlan(9, ETH_P_IP)
                    .ipv4(v4(6), IPPROTO_UDP, 0, 0)
                    .udp(),
                3,
                Reason::VlanDepthExceeded,
            ),
            Reason::VlanDepthExceeded,
        ),
        ("arp", Frame::eth(ETH_P_ARP).payload(28), Reason::NonIp),
        ("802.1Q arp", Frame::eth(ETH_P_8021Q).vlan(1, ETH_P_ARP).payload(28), Reason::NonIp),
        ("lldp", Frame::eth(0x88cc).payload(30), Reason::NonIp),
        ("mpls", Frame::eth(0x8847).payload(40), Reason::NonIp),
    ]
}

/// Family the spec says a frame is counted under: the EtherType after
/// at most two VLAN tags (IPv4, IPv6, or none for anything else).
fn documented_family(frame: &[u8]) -> limiter_common::Family {
    let mut off = 12;
    for _ in 0..2 {
        match frame.get(off..off + 2) {
            Some([0x81, 0x00] | [0x88, 0xa8]) => off += 4,
            _ => break,
        }
    }
    match frame.get(off..off + 2) {
        Some([0x08, 0x00]) => limiter_common::family::IPV4,
        Some([0x86, 0xdd]) => limiter_common::family::IPV6,
        _ => limiter_common::family::NONE,
    }
}

#[test]
fn fixture_table() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = kernel::open(&kernel::config(1_000_000, 1_000_000, false, 24, 56));
    for (name, f, reason) in table() {
        let (action, delta) = kernel::run_at(&mut l, NOW, &f.bytes);
        assert_eq!(action, documented_action(reason), "{name}: action");
        assert_counted_once(&delta, reason, f.bytes.len(), name);
        let fam = documented_family(&f.bytes);
        assert_eq!(delta.of_family(reason, fam).packets, 1, "{name}: family {fam:?}");
    }
}

#[test]
fn truncation_at_every_byte_offset() {
    let _alone = limiter_tests::alone(module_path!());
    let mut l = kernel::open(&kernel::config(1_000_000, 1_000_000, false, 24, 56));
    let mut checked = 0;
    for (name, f, whole) in table() {
        for len in 0..f.bytes.len() {
            let cut = &f.bytes[..len];
            if len < 14 {
                // The kernel refuses to run XDP on a frame shorter than an
                // Ethernet header (and no NIC delivers one), so EthTruncated
                // is defensive; check the refusal instead.
                assert!(
                    l.test_run(limiter_common::programs::LIMITER_TEST_CLOCK, cut, 1).is_err(),
                    "{name}: {len} bytes ran"
                );
                continue;
            }
            let expect = f.cut_reason(len).unwrap_or(whole);
            let what = format!("{name} cut to {len} bytes");
            let (action, delta) = kernel::run_at(&mut l, NOW, cut);
            assert_eq!(action, documented_action(expect), "{what}: action");
            assert_counted_once(&delta, expect, len, &what);
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} cuts checked");
}
