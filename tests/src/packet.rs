//! Frame builder for fixtures. Besides the bytes, it records where each
//! header ends and which documented reason a frame cut short inside that
//! header must get, so truncation expectations come from the layout of the
//! protocols, not from the parser under test.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::Reason;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_AUTH: u8 = 51;
pub const NEXTHDR_DEST: u8 = 60;

/// A frame and the end offset of each header with its truncation reason.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    pub bytes: Vec<u8>,
    pub layers: Vec<(usize, Reason)>,
}

impl Frame {
    fn push(mut self, hdr: &[u8], cut: Reason) -> Self {
        self.bytes.extend_from_slice(hdr);
        self.layers.push((self.bytes.len(), cut));
        self
    }

    /// Ethernet header carrying `ether_type`.
    #[must_use]
    pub fn eth(ether_type: u16) -> Self {
        let mut h = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        h.extend_from_slice(&ether_type.to_be_bytes());
        Self::default().push(&h, Reason::EthTruncated)
    }

    /// One VLAN tag whose inner EtherType is `inner`.
    #[must_use]
    pub fn vlan(self, vid: u16, inner: u16) -> Self {
        let mut h = vid.to_be_bytes().to_vec();
        h.extend_from_slice(&inner.to_be_bytes());
        self.push(&h, Reason::VlanTruncated)
    }

    /// IPv4 header with `opt_words` 32-bit words of options (NOPs) and the
    /// raw 16-bit flags/fragment-offset field.
    #[must_use]
    pub fn ipv4(self, src: Ipv4Addr, proto: u8, opt_words: u8, frag: u16) -> Self {
        let ihl = 5 + opt_words;
        let mut h = vec![0x40 | ihl, 0, 0, 0, 0, 1];
        h.extend_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(&[64, proto, 0, 0]);
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&Ipv4Addr::new(198, 18, 0, 2).octets());
        h.extend(std::iter::repeat_n(1u8, usize::from(opt_words) * 4));
        self.push(&h, Reason::Ipv4Truncated)
    }

    /// The same frame to `dst`: its (first) IPv4 header, untagged, is
    /// addressed to it.
    #[must_use]
    pub fn to_v4(mut self, dst: Ipv4Addr) -> Self {
        self.bytes[30..34].copy_from_slice(&dst.octets());
        self
    }

    /// The same frame to `dst`: its IPv6 header, untagged, is addressed to
    /// it.
    #[must_use]
    pub fn to_v6(mut self, dst: Ipv6Addr) -> Self {
        self.bytes[38..54].copy_from_slice(&dst.octets());
        self
    }

    /// IPv4 header with a raw first byte (version/IHL) for malformed cases.
    #[must_use]
    pub fn ipv4_raw_vihl(self, vihl: u8) -> Self {
        let mut h = vec![vihl, 0, 0, 0, 0, 1, 0, 0, 64, IPPROTO_UDP, 0, 0];
        h.extend_from_slice(&[198, 18, 9, 9, 198, 18, 0, 2]);
        self.push(&h, Reason::Ipv4Truncated)
    }

    /// IPv6 fixed header.
    #[must_use]
    pub fn ipv6(self, src: Ipv6Addr, next: u8) -> Self {
        let mut h = vec![0x60, 0, 0, 0, 0, 0, next, 64];
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&"2001:2::2".parse::<Ipv6Addr>().unwrap().octets());
        self.push(&h, Reason::Ipv6Truncated)
    }

    /// A generic extension header (hop-by-hop, routing, destination) of
    /// `(len8 + 1) * 8` bytes.
    #[must_use]
    pub fn ext(self, next: u8, len8: u8) -> Self {
        let mut h = vec![next, len8];
        h.resize((usize::from(len8) + 1) * 8, 1);
        self.push(&h, Reason::Ipv6ExtTruncated)
    }

    /// An authentication header of `(len4 + 2) * 4` bytes.
    #[must_use]
    pub fn auth(self, next: u8, len4: u8) -> Self {
        let mut h = vec![next, len4];
        h.resize((usize::from(len4) + 2) * 4, 0);
        self.push(&h, Reason::Ipv6ExtTruncated)
    }

    /// IPv6 fragment header with offset in 8-byte units.
    #[must_use]
    pub fn frag6(self, next: u8, offset8: u16, more: bool) -> Self {
        let field = (offset8 << 3) | u16::from(more);
        let mut h = vec![next, 0];
        h.extend_from_slice(&field.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 7]);
        self.push(&h, Reason::Ipv6ExtTruncated)
    }

    #[must_use]
    pub fn udp(self) -> Self {
        self.push(&[0x30, 0x39, 0x23, 0x28, 0, 8, 0, 0], Reason::L4Truncated)
    }

    /// UDP header to `dport` (from port 12345).
    #[must_use]
    pub fn udp_to(self, dport: u16) -> Self {
        self.udp_ports(12345, dport)
    }

    /// UDP header from `sport` to `dport`.
    #[must_use]
    pub fn udp_ports(self, sport: u16, dport: u16) -> Self {
        let mut h = sport.to_be_bytes().to_vec();
        h.extend_from_slice(&dport.to_be_bytes());
        h.extend_from_slice(&[0, 8, 0, 0]);
        self.push(&h, Reason::L4Truncated)
    }

    /// TCP header to `dport` with raw `flags` (SYN 0x02, ACK 0x10).
    #[must_use]
    pub fn tcp_to(self, dport: u16, flags: u8) -> Self {
        self.tcp_ports(12345, dport, flags)
    }

    /// TCP header from `sport` to `dport` with raw `flags`.
    #[must_use]
    pub fn tcp_ports(self, sport: u16, dport: u16, flags: u8) -> Self {
        let mut h = sport.to_be_bytes().to_vec();
        h.extend_from_slice(&dport.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags]);
        h.resize(20, 0);
        self.push(&h, Reason::L4Truncated)
    }

    #[must_use]
    pub fn tcp(self) -> Self {
        let mut h = vec![0x30, 0x39, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02];
        h.resize(20, 0);
        self.push(&h, Reason::L4Truncated)
    }

    /// Bytes no parser looks at (ICMP, payload, ARP body); cutting them
    /// changes no verdict.
    #[must_use]
    pub fn payload(mut self, n: usize) -> Self {
        self.bytes.extend(std::iter::repeat_n(0xab, n));
        self
    }

    /// The bytes as a receiving stack accepts them: IPv4 total length, UDP
    /// length and IPv4 header checksum filled in (the parser under test
    /// reads none of them). Ethernet + 20-byte IPv4 + UDP frames only.
    #[must_use]
    pub fn on_the_wire(self) -> Vec<u8> {
        let mut f = self.bytes;
        let ip_len = u16::try_from(f.len() - 14).expect("a frame shorter than 64 KiB");
        f[16..18].copy_from_slice(&ip_len.to_be_bytes());
        f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
        f[24..26].fill(0);
        let sum: u32 = f[14..34].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        let csum = !u16::try_from((folded & 0xffff) + (folded >> 16)).expect("folded to 16 bits");
        f[24..26].copy_from_slice(&csum.to_be_bytes());
        f
    }

    /// The reason a copy cut to `len` bytes must get, or `None` if every
    /// header is whole (then the full frame's reason applies).
    #[must_use]
    pub fn cut_reason(&self, len: usize) -> Option<Reason> {
        self.layers.iter().find(|(end, _)| len < *end).map(|(_, r)| *r)
    }
}
