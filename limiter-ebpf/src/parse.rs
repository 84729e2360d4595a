//! Packet walk: Ethernet, up to `MAX_VLAN_DEPTH` VLAN tags, IPv4 (options,
//! fragments) or IPv6 (bounded extension-header walk), and the TCP/UDP
//! header of first fragments. Every way a packet can be malformed maps to
//! exactly one `Reason`.

use aya_ebpf::programs::XdpContext;
use limiter_common::{
    Reason, family,
    reason::{MAX_IPV6_EXT_HEADERS, MAX_VLAN_DEPTH},
};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
    vlan::VlanHdr,
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
// IPv6 extension headers walked (RFC 8200 section 4, RFC 4302 for AH).
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;
const NEXTHDR_MOBILITY: u8 = 135;
const NEXTHDR_HIP: u8 = 139;
const NEXTHDR_SHIM6: u8 = 140;

/// Largest L3 offset we accept; keeps variable offsets bounded for the
/// verifier (2 VLAN tags + 15-word IPv4 header is far below it).
const MAX_OFFSET: usize = 4096;

/// What the limiter needs from a packet.
pub struct Source {
    pub family: u8,
    /// Source address in network byte order (IPv4 in `addr[0]`).
    pub addr: [u32; 4],
    /// IP protocol of the L4 header (or of the fragment).
    pub proto: u8,
    /// 1 when `dport` was read (TCP/UDP, unfragmented or first fragment).
    pub port_known: u8,
    /// TCP SYN without ACK.
    pub syn: u8,
    pub dport: u16,
}

/// The one packet accessor: the `N` bytes at `off`, if they all fit.
///
/// Headers are always fetched as one fixed-size block and read through the
/// returned reference: LLVM rewrites single-byte bounds checks (`p + 1 >
/// end`) into `p >= end`, which the verifier cannot turn into a range.
#[inline(always)]
fn bytes_at<const N: usize>(ctx: &XdpContext, off: usize) -> Option<&[u8; N]> {
    let start = ctx.data();
    if start + off + N > ctx.data_end() {
        return None;
    }
    // SAFETY: the N bytes at start + off are inside the packet.
    Some(unsafe { &*((start + off) as *const [u8; N]) })
}

#[inline(always)]
fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

#[inline(always)]
fn word(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Parse up to the source address; `Err` carries the verdict's reason.
/// `fam` is set to the stat family (1 IPv4, 2 IPv6) as soon as the
/// EtherType is known, so malformed IP is counted under its family.
#[inline(always)]
pub fn parse(ctx: &XdpContext, fam: &mut u32) -> Result<Source, Reason> {
    let eth = bytes_at::<{ EthHdr::LEN }>(ctx, 0).ok_or(Reason::EthTruncated)?;
    let mut proto = be16(eth, 12);
    let mut off = EthHdr::LEN;
    // Bounded walk: MAX_VLAN_DEPTH tags; a tag beyond that is flagged below.
    for _ in 0..MAX_VLAN_DEPTH {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let tag = bytes_at::<{ VlanHdr::LEN }>(ctx, off).ok_or(Reason::VlanTruncated)?;
        proto = be16(tag, 2);
        off += VlanHdr::LEN;
    }
    match proto {
        ETH_P_IP => {
            *fam = 1;
            parse_ipv4(ctx, off)
        }
        ETH_P_IPV6 => {
            *fam = 2;
            parse_ipv6(ctx, off)
        }
        ETH_P_8021Q | ETH_P_8021AD => Err(Reason::VlanDepthExceeded),
        _ => Err(Reason::NonIp),
    }
}

#[inline(always)]
fn parse_ipv4(ctx: &XdpContext, off: usize) -> Result<Source, Reason> {
    let ip = bytes_at::<{ Ipv4Hdr::LEN }>(ctx, off).ok_or(Reason::Ipv4Truncated)?;
    let ihl = usize::from(ip[0] & 0x0f);
    if ip[0] >> 4 != 4 || ihl < 5 {
        return Err(Reason::Ipv4BadHeader);
    }
    let hlen = ihl * 4;
    // Options must be present in full.
    if ctx.data() + off + hlen > ctx.data_end() {
        return Err(Reason::Ipv4Truncated);
    }
    let mut src =
        Source { family: family::IPV4, addr: [word(ip, 12), 0, 0, 0], proto: ip[9], port_known: 0, syn: 0, dport: 0 };
    // Non-first fragments carry no L4 header; they are charged like the rest.
    if be16(ip, 6) & 0x1fff == 0 {
        read_l4(ctx, off + hlen, &mut src)?;
    }
    Ok(src)
}

#[inline(always)]
fn parse_ipv6(ctx: &XdpContext, off: usize) -> Result<Source, Reason> {
    let ip = bytes_at::<{ Ipv6Hdr::LEN }>(ctx, off).ok_or(Reason::Ipv6Truncated)?;
    if ip[0] >> 4 != 6 {
        return Err(Reason::Ipv6BadHeader);
    }
    let mut src = Source {
        family: family::IPV6,
        addr: [word(ip, 8), word(ip, 12), word(ip, 16), word(ip, 20)],
        proto: 0,
        port_known: 0,
        syn: 0,
        dport: 0,
    };
    let mut next = ip[6];
    let mut off = off + Ipv6Hdr::LEN;
    // Bounded walk of extension headers; a header past the limit is its own
    // reason so a long chain cannot hide the L4 header.
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        if !is_ext(next) {
            src.proto = next;
            return read_l4(ctx, off, &mut src).map(|()| src);
        }
        // Every extension header is at least 8 bytes long.
        let ext = bytes_at::<8>(ctx, off).ok_or(Reason::Ipv6ExtTruncated)?;
        let hlen = match next {
            NEXTHDR_FRAGMENT => 8,
            NEXTHDR_AUTH => (usize::from(ext[1]) + 2) * 4,
            _ => (usize::from(ext[1]) + 1) * 8,
        };
        if ctx.data() + off + hlen > ctx.data_end() {
            return Err(Reason::Ipv6ExtTruncated);
        }
        if next == NEXTHDR_FRAGMENT && be16(ext, 2) & 0xfff8 != 0 {
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
    read_l4(ctx, off, &mut src).map(|()| src)
}

#[inline(always)]
fn is_ext(next: u8) -> bool {
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
/// destination port and the SYN flag from them.
#[inline(always)]
fn read_l4(ctx: &XdpContext, off: usize, src: &mut Source) -> Result<(), Reason> {
    match src.proto {
        IPPROTO_TCP => {
            let tcp = bytes_at::<{ TcpHdr::LEN }>(ctx, off).ok_or(Reason::L4Truncated)?;
            src.dport = be16(tcp, 2);
            // Flags byte: SYN 0x02, ACK 0x10.
            src.syn = u8::from(tcp[13] & 0x12 == 0x02);
            src.port_known = 1;
        }
        IPPROTO_UDP => {
            let udp = bytes_at::<{ UdpHdr::LEN }>(ctx, off).ok_or(Reason::L4Truncated)?;
            src.dport = be16(udp, 2);
            src.port_known = 1;
        }
        _ => {}
    }
    Ok(())
}
