//! The one frame parser: Ethernet, up to [`MAX_VLAN_DEPTH`] VLAN tags,
//! IPv4 (options, fragments) or IPv6 (bounded extension-header walk), and
//! the TCP/UDP header of first fragments. Every way a frame can be
//! malformed maps to exactly one [`Reason`] (invariant 9).
//!
//! It is generic over [`Frame`], how bytes are fetched: the XDP program
//! implements it over the packet it is given, userspace over a byte slice
//! (`limiter replay`, host tests), so both run the same code.

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
    vlan::VlanHdr,
};

use crate::{
    Reason, family,
    reason::{MAX_IPV6_EXT_HEADERS, MAX_VLAN_DEPTH},
};

/// The fragment-offset bits of the IPv4 flags-and-offset field.
const IPV4_FRAG_OFFSET: u16 = 0x1fff;
/// The offset bits of the IPv6 fragment header's offset-and-flags field.
const IPV6_FRAG_OFFSET: u16 = 0xfff8;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
// IPv6 extension headers walked (RFC 8200 section 4, RFC 4302 for AH).
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;
const NEXTHDR_MOBILITY: u8 = 135;
const NEXTHDR_HIP: u8 = 139;
const NEXTHDR_SHIM6: u8 = 140;

/// Largest offset an IPv6 extension walk may reach; keeps variable
/// offsets bounded for the verifier (2 VLAN tags and a 15-word IPv4
/// header are far below it).
const MAX_OFFSET: usize = 4096;

/// Where a frame's bytes come from.
pub trait Frame {
    /// The `N` bytes at `off`, if they all lie inside the frame.
    ///
    /// In XDP headers are always fetched as one fixed-size block and read
    /// through the returned reference: LLVM rewrites single-byte bounds
    /// checks (`p + 1 > end`) into `p >= end`, which the verifier cannot
    /// turn into a range.
    fn bytes_at<const N: usize>(&self, off: usize) -> Option<&[u8; N]>;
    /// Whether `len` bytes at `off` lie inside the frame.
    fn holds(&self, off: usize, len: usize) -> bool;
}

impl Frame for [u8] {
    #[inline]
    fn bytes_at<const N: usize>(&self, off: usize) -> Option<&[u8; N]> {
        self.get(off..off.checked_add(N)?)?.try_into().ok()
    }

    #[inline]
    fn holds(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len())
    }
}

/// What the limiter needs from a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Source {
    pub family: crate::Family,
    /// Source address in network byte order (IPv4 in `addr[0]`).
    pub addr: [u32; 4],
    /// IP protocol of the L4 header (or of the fragment).
    pub proto: u8,
    /// 1 when `dport` and `sport` were read (TCP/UDP, unfragmented or
    /// first fragment).
    pub port_known: u8,
    /// TCP SYN without ACK.
    pub syn: u8,
    pub dport: u16,
    /// The source port: what a reflection class matches (an amplified
    /// answer comes from its service's port: 53, 123, 11211, ...).
    pub sport: u16,
    /// The TCP flags byte (0 for other protocols).
    pub tcp_flags: u8,
}

impl Source {
    /// The source address (its words are in network order, as parsed).
    #[must_use]
    pub fn ip(&self) -> core::net::IpAddr {
        let mut b = [0u8; 16];
        for (i, w) in self.addr.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        if self.family == crate::family::IPV6 {
            core::net::IpAddr::from(b)
        } else {
            core::net::IpAddr::from([b[0], b[1], b[2], b[3]])
        }
    }
}

/// TCP flag bits of [`Source::tcp_flags`].
pub mod tcp_flag {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

#[inline(always)]
fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

/// The 4 bytes of `b` at `i` as they lie (an address word, network order).
#[inline(always)]
#[must_use]
pub fn word(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Parse up to the source address; `Err` carries the verdict's reason.
/// `fam` is set to the [`family`] as soon as the EtherType is known, so
/// malformed IP is counted under its family.
#[inline(always)]
pub fn parse<F: Frame + ?Sized>(f: &F, fam: &mut crate::Family) -> Result<Source, Reason> {
    let eth = f.bytes_at::<{ EthHdr::LEN }>(0).ok_or(Reason::EthTruncated)?;
    let mut proto = be16(eth, 12);
    let mut off = EthHdr::LEN;
    // Bounded walk: MAX_VLAN_DEPTH tags; a tag beyond that is flagged below.
    for _ in 0..MAX_VLAN_DEPTH {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let tag = f.bytes_at::<{ VlanHdr::LEN }>(off).ok_or(Reason::VlanTruncated)?;
        proto = be16(tag, 2);
        off += VlanHdr::LEN;
    }
    match proto {
        ETH_P_IP => {
            *fam = family::IPV4;
            parse_ipv4(f, off)
        }
        ETH_P_IPV6 => {
            *fam = family::IPV6;
            parse_ipv6(f, off)
        }
        ETH_P_8021Q | ETH_P_8021AD => Err(Reason::VlanDepthExceeded),
        _ => Err(Reason::NonIp),
    }
}

#[inline(always)]
fn parse_ipv4<F: Frame + ?Sized>(f: &F, off: usize) -> Result<Source, Reason> {
    let ip = f.bytes_at::<{ Ipv4Hdr::LEN }>(off).ok_or(Reason::Ipv4Truncated)?;
    let ihl = usize::from(ip[0] & 0x0f);
    if ip[0] >> 4 != 4 || ihl < 5 {
        return Err(Reason::Ipv4BadHeader);
    }
    let hlen = ihl * 4;
    // Options must be present in full.
    if !f.holds(off, hlen) {
        return Err(Reason::Ipv4Truncated);
    }
    let mut src = Source { family: family::IPV4, addr: [word(ip, 12), 0, 0, 0], proto: ip[9], ..Source::default() };
    // Non-first fragments carry no L4 header; they are charged like the rest.
    if be16(ip, 6) & IPV4_FRAG_OFFSET == 0 {
        read_l4(f, off + hlen, &mut src)?;
    }
    Ok(src)
}

#[inline(always)]
fn parse_ipv6<F: Frame + ?Sized>(f: &F, off: usize) -> Result<Source, Reason> {
    let ip = f.bytes_at::<{ Ipv6Hdr::LEN }>(off).ok_or(Reason::Ipv6Truncated)?;
    if ip[0] >> 4 != 6 {
        return Err(Reason::Ipv6BadHeader);
    }
    let mut src = Source {
        family: family::IPV6,
        addr: [word(ip, 8), word(ip, 12), word(ip, 16), word(ip, 20)],
        ..Source::default()
    };
    let mut next = ip[6];
    let mut off = off + Ipv6Hdr::LEN;
    // Bounded walk of extension headers; a header past the limit is its own
    // reason so a long chain cannot hide the L4 header.
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        if !is_ext(next) {
            src.proto = next;
            return read_l4(f, off, &mut src).map(|()| src);
        }
        // Every extension header is at least 8 bytes long.
        let ext = f.bytes_at::<8>(off).ok_or(Reason::Ipv6ExtTruncated)?;
        let hlen = match next {
            NEXTHDR_FRAGMENT => 8,
            NEXTHDR_AUTH => (usize::from(ext[1]) + 2) * 4,
            _ => (usize::from(ext[1]) + 1) * 8,
        };
        if !f.holds(off, hlen) {
            return Err(Reason::Ipv6ExtTruncated);
        }
        if next == NEXTHDR_FRAGMENT && be16(ext, 2) & IPV6_FRAG_OFFSET != 0 {
            // Non-first fragment: no L4 header follows.
            src.proto = ext[0];
            return Ok(src);
        }
        next = ext[0];
        off += hlen;
        if off > MAX_OFFSET {
            return Err(Reason::Ipv6ExtTruncated);
        }
    }
    if is_ext(next) {
        return Err(Reason::Ipv6ExtLimit);
    }
    src.proto = next;
    read_l4(f, off, &mut src).map(|()| src)
}

/// Where the upper-layer header of an IPv6 packet starts, past its
/// extension headers: its type and offset, from the fixed header's next
/// header `next` and the offset `off` after it. The walk of
/// [`parse_ipv6`], as bounded, without its reasons: `None` for a chain it
/// refuses (too long, past [`MAX_OFFSET`], cut short) and for a later
/// fragment (no upper-layer header follows).
#[inline(always)]
#[must_use]
pub fn ipv6_upper<F: Frame + ?Sized>(f: &F, mut off: usize, mut next: u8) -> Option<(u8, usize)> {
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        if !is_ext(next) {
            return Some((next, off));
        }
        let ext = f.bytes_at::<8>(off)?;
        let hlen = match next {
            NEXTHDR_FRAGMENT => 8,
            NEXTHDR_AUTH => (usize::from(ext[1]) + 2) * 4,
            _ => (usize::from(ext[1]) + 1) * 8,
        };
        if next == NEXTHDR_FRAGMENT && be16(ext, 2) & IPV6_FRAG_OFFSET != 0 {
            return None;
        }
        next = ext[0];
        off += hlen;
        if off > MAX_OFFSET {
            return None;
        }
    }
    (!is_ext(next)).then_some((next, off))
}

/// Whether `next` names an IPv6 extension header (one the parse walks).
#[inline(always)]
#[must_use]
pub fn is_ext(next: u8) -> bool {
    matches!(
        next,
        NEXTHDR_HOP
            | NEXTHDR_ROUTING
            | NEXTHDR_FRAGMENT
            | NEXTHDR_AUTH
            | NEXTHDR_DEST
            | NEXTHDR_MOBILITY
            | NEXTHDR_HIP
            | NEXTHDR_SHIM6
    )
}

/// TCP and UDP headers of first fragments must be complete; read the
/// ports and the SYN flag from them.
#[inline(always)]
fn read_l4<F: Frame + ?Sized>(f: &F, off: usize, src: &mut Source) -> Result<(), Reason> {
    match src.proto {
        IPPROTO_TCP => {
            let tcp = f.bytes_at::<{ TcpHdr::LEN }>(off).ok_or(Reason::L4Truncated)?;
            // SYN+RST and SYN+FIN are invalid in every state, and a data
            // offset under 5 words is no header: refused here, before any
            // bucket or budget is touched.
            let flags = tcp[13];
            if tcp[12] >> 4 < 5 || (flags & tcp_flag::SYN != 0 && flags & (tcp_flag::RST | tcp_flag::FIN) != 0) {
                return Err(Reason::TcpBadFlags);
            }
            src.sport = be16(tcp, 0);
            src.dport = be16(tcp, 2);
            src.tcp_flags = tcp[13];
            src.syn = u8::from(tcp[13] & (tcp_flag::SYN | tcp_flag::ACK) == tcp_flag::SYN);
            src.port_known = 1;
        }
        IPPROTO_UDP => {
            let udp = f.bytes_at::<{ UdpHdr::LEN }>(off).ok_or(Reason::L4Truncated)?;
            src.sport = be16(udp, 0);
            src.dport = be16(udp, 2);
            src.port_known = 1;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// Ethernet + optional VLAN tags + IPv4/TCP SYN to port 443.
    fn v4_syn(vlans: usize) -> Vec<u8> {
        let mut f = Vec::from([0u8; 12]);
        for _ in 0..vlans {
            f.extend([0x81, 0x00, 0x00, 0x05]);
        }
        f.extend([0x08, 0x00]);
        f.extend([0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, IPPROTO_TCP, 0, 0, 198, 18, 7, 9, 198, 18, 0, 2]);
        f.extend([0x30, 0x39, 0x01, 0xbb, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x02, 0, 0, 0, 0, 0, 0]);
        f
    }

    #[test]
    fn reads_source_port_and_syn_through_vlan_tags() {
        for vlans in 0..=MAX_VLAN_DEPTH {
            let mut fam = family::NONE;
            let s = parse(v4_syn(vlans).as_slice(), &mut fam).unwrap();
            assert_eq!(fam, family::IPV4);
            assert_eq!(s.addr[0], u32::from_ne_bytes([198, 18, 7, 9]));
            assert_eq!((s.proto, s.dport, s.syn, s.port_known), (IPPROTO_TCP, 443, 1, 1));
            assert_eq!(s.tcp_flags, 0x02);
        }
        let mut fam = family::NONE;
        assert_eq!(parse(v4_syn(3).as_slice(), &mut fam), Err(Reason::VlanDepthExceeded));
    }

    #[test]
    fn every_cut_of_a_frame_gets_one_reason_and_never_reads_past_it() {
        let whole = v4_syn(1);
        for cut in 0..whole.len() {
            let mut fam = family::NONE;
            let r = parse(&whole[..cut], &mut fam).unwrap_err();
            assert!(r.verdict() == crate::Verdict::Drop, "cut {cut}: {r:?}");
        }
    }

    #[test]
    fn a_long_ipv6_extension_chain_is_its_own_reason() {
        let mut f = Vec::from([0u8; 12]);
        f.extend([0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, NEXTHDR_DEST, 64]);
        f.extend([0x20, 0x01, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend([0u8; 16]);
        for _ in 0..=MAX_IPV6_EXT_HEADERS {
            f.extend([NEXTHDR_DEST, 0, 0, 0, 0, 0, 0, 0]);
        }
        let mut fam = family::NONE;
        assert_eq!(parse(f.as_slice(), &mut fam), Err(Reason::Ipv6ExtLimit));
        assert_eq!(fam, family::IPV6);
    }

    /// The IPv6 header (54 bytes in, after Ethernet) followed by `chain`:
    /// (type, header bytes) pairs, the first named by the fixed header.
    fn v6_chain(chain: &[(u8, &[u8])]) -> Vec<u8> {
        let mut f = Vec::from([0u8; 12]);
        f.extend([0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, chain[0].0, 64]);
        f.extend([0u8; 32]);
        for (_, h) in chain {
            f.extend_from_slice(h);
        }
        f
    }

    #[test]
    fn the_upper_header_behind_ipv6_extensions_is_found_where_the_chain_puts_it() {
        let tcp = [0u8; 20];
        // A destination option (8 bytes) before TCP: TCP at 54 + 8.
        let dest = [IPPROTO_TCP, 0, 1, 4, 0, 0, 0, 0];
        let f = v6_chain(&[(NEXTHDR_DEST, &dest), (IPPROTO_TCP, &tcp)]);
        assert_eq!(ipv6_upper(f.as_slice(), 54, NEXTHDR_DEST), Some((IPPROTO_TCP, 62)));
        // Hop-by-hop of 16 bytes (length 1), then a first fragment's header.
        let mut hop = [0u8; 16];
        hop[0] = NEXTHDR_FRAGMENT;
        hop[1] = 1;
        let first = [IPPROTO_TCP, 0, 0, 1, 0, 0, 0, 7];
        let f = v6_chain(&[(NEXTHDR_HOP, &hop), (NEXTHDR_FRAGMENT, &first), (IPPROTO_TCP, &tcp)]);
        assert_eq!(ipv6_upper(f.as_slice(), 54, NEXTHDR_HOP), Some((IPPROTO_TCP, 54 + 16 + 8)));
        // A later fragment carries no TCP header.
        let later = [IPPROTO_TCP, 0, 0, 8 << 3, 0, 0, 0, 7];
        let f = v6_chain(&[(NEXTHDR_FRAGMENT, &later), (IPPROTO_TCP, &tcp)]);
        assert_eq!(ipv6_upper(f.as_slice(), 54, NEXTHDR_FRAGMENT), None);
        // No extension header at all; a chain cut short.
        let f = v6_chain(&[(IPPROTO_TCP, &tcp)]);
        assert_eq!(ipv6_upper(f.as_slice(), 54, IPPROTO_TCP), Some((IPPROTO_TCP, 54)));
        let f = v6_chain(&[(NEXTHDR_DEST, &dest[..4])]);
        assert_eq!(ipv6_upper(f.as_slice(), 54, NEXTHDR_DEST), None);
        // Past the parse's limit of headers: none.
        let mut chain: Vec<(u8, &[u8])> = Vec::new();
        let d = [NEXTHDR_DEST, 0, 0, 0, 0, 0, 0, 0];
        for _ in 0..=MAX_IPV6_EXT_HEADERS {
            chain.push((NEXTHDR_DEST, &d));
        }
        assert_eq!(ipv6_upper(v6_chain(&chain).as_slice(), 54, NEXTHDR_DEST), None);
    }
}
