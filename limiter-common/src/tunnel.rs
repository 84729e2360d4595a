//! Forwarding at the driver (the policy's `[[tunnel]]` sections): a packet
//! the limiter admits for a tunnelled service (destination address,
//! protocol, port) is encapsulated to one of the service's backends and
//! sent out by the program, never reaching this host's stack. The backend
//! is the one its flow's connection-table entry names, else the one its
//! flow hash picks from the service's Maglev table (computed by the
//! daemon, [`TABLE_SIZE`] slots); the backend decapsulates with the
//! kernel's own tunnel and answers the client directly.

/// Services (Maglev tables) a policy may declare.
pub const MAX_SERVICES: u32 = 16;
/// Entries of the service map: one per (address, protocol, port), so a
/// port range takes one per port.
pub const SERVICE_PORTS: u32 = 4096;
/// Backends over every service.
pub const MAX_BACKENDS: u32 = 256;
/// Slots of each service's Maglev table: a prime, about 256 per backend
/// at 256 backends (Maglev's paper keeps the table at least 100 times the
/// backends, so each backend's share is within about 1% of its weight's).
pub const TABLE_SIZE: u32 = 65_537;
/// Entries of the connection table (LRU): flows remembered on the
/// backend they were first sent to.
pub const CONNECTIONS: u32 = 1 << 18;
/// A table slot with no backend (every backend of the service down or
/// drained).
pub const NO_BACKEND: u32 = u32::MAX;

/// How a service's packets are wrapped ([`Service::encap`]).
pub mod encap {
    /// IPv4 in IPv4 (protocol 4) or IPv6 in IPv6 (next header 41): the
    /// backend's `ipip` / `ip6tnl` device decapsulates.
    pub const IPIP: u8 = 0;
    /// The inner packet in a UDP datagram to [`super::Service::port`]
    /// (Foo-over-UDP: the backend's `ip fou add port P ipproto 4`).
    pub const FOU: u8 = 1;
    /// As FOU, behind a 4-byte GUE header naming the inner protocol
    /// (`ip fou add port P gue`).
    pub const GUE: u8 = 2;
}

/// Bits of [`Service::flags`].
pub mod service {
    /// A packet too big for the path once wrapped is passed to the stack
    /// (neither this nor [`TOO_BIG_DROP`]: answered with ICMP's
    /// "fragmentation needed" or ICMPv6's "packet too big", so the
    /// client's path MTU discovery shrinks its packets).
    pub const TOO_BIG_PASS: u8 = 1;
    /// A packet too big for the path once wrapped is dropped.
    pub const TOO_BIG_DROP: u8 = 4;
    /// With no backend up, a packet is passed to the stack (else dropped).
    pub const EMPTY_PASS: u8 = 2;
}

/// [`Backend::state`].
pub mod state {
    /// Takes new flows and keeps its connections.
    pub const UP: u8 = 0;
    /// Failing its health check: out of the table, and its connections
    /// are moved (a packet of one picks a backend again).
    pub const DOWN: u8 = 1;
    /// Drained by the operator: out of the table, keeps its connections.
    pub const DRAINED: u8 = 2;
}

/// What the program counts per packet it does not forward, and per
/// packet sent through the stack ([`OUTCOMES`] slots of `TUNNEL_OUTCOMES`).
pub mod outcome {
    /// No backend up: dropped or passed, as the service says.
    pub const NO_BACKEND: u32 = 0;
    /// Too big for the path once wrapped (answered with ICMP, dropped or
    /// passed, as the service says).
    pub const TOO_BIG: u32 = 1;
    /// No route XDP can send on: the next hop's address not resolved,
    /// forwarding off, no route. Dropped.
    pub const UNROUTABLE: u32 = 2;
    /// A fragment, or an IPv6 packet behind extension headers: its ports
    /// are not read, so it is passed unforwarded.
    pub const UNREAD: u32 = 3;
    /// The frame could not be grown for the outer headers.
    pub const NO_ROOM: u32 = 4;
}
pub const OUTCOMES: u32 = 8;

/// `TUNNEL_SERVICES`'s key: a destination the policy forwards.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    /// The destination address (IPv4 in the first 4 bytes, the rest 0).
    pub addr: [u8; 16],
    /// The destination port, host order.
    pub port: u16,
    /// IP protocol (6 or 17).
    pub proto: u8,
    /// 1: IPv6.
    pub v6: u8,
}

/// `TUNNEL_SERVICES`'s value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Service {
    /// Its table's index (< [`MAX_SERVICES`]): slots
    /// `index * TABLE_SIZE ..` of `TUNNEL_TABLE`.
    pub index: u32,
    /// [`encap`].
    pub encap: u8,
    /// [`service`] bits.
    pub flags: u8,
    /// The outer header's TTL (hop limit).
    pub ttl: u8,
    /// 1: the outer header (its backends, [`Service::source`]) is IPv6.
    pub v6: u8,
    /// FOU and GUE: the backends' UDP port, host order.
    pub port: u16,
    pub pad: u16,
    /// The outer header's source address: this host's.
    pub source: [u8; 16],
}

/// `TUNNEL_BACKENDS`'s value, by backend index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    /// Where the outer header goes (IPv4 in the first 4 bytes).
    pub addr: [u8; 16],
    /// [`state`].
    pub state: u8,
    pub pad: [u8; 3],
    /// Its service's index: an entry of the connection table left from
    /// another policy is not followed to another service's backend.
    pub service: u32,
}

/// `TUNNEL_HOPS`'s value, per CPU, by backend index: the backend's next
/// hop as `bpf_fib_lookup` found it, kept for [`HOP_JIFFIES`] so that a
/// packet pays a map read instead of a route and neighbour lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hop {
    /// `jiffies` when it was looked up.
    pub at: u64,
    /// The interface it leaves by (0: none kept).
    pub ifindex: u32,
    /// The route's MTU.
    pub mtu: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    pub pad: [u8; 4],
}

/// How long a kept next hop is used before it is looked up again: 256
/// jiffies (about a second at HZ=250, a quarter at HZ=1000), so a route
/// or neighbour that changes is followed within that.
pub const HOP_JIFFIES: u64 = 256;

/// `TUNNEL_CONNS`'s key: a flow to a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Source and destination ports, as on the wire.
    pub ports: [u8; 4],
    pub proto: u8,
    pub pad: [u8; 3],
}

/// The flow's hash: picks its Maglev slot (`hash % TABLE_SIZE`), and the
/// outer UDP source port of FOU and GUE (so the backend's NIC spreads
/// flows over its queues). Of the source address, both ports and the
/// protocol; the destination is the service's.
#[must_use]
#[inline(always)]
pub const fn flow_hash(src: &[u8; 16], ports: &[u8; 4], proto: u8) -> u32 {
    let mut h: u32 = 0x9e37_79b9 ^ proto as u32;
    let mut i = 0;
    while i < 4 {
        let w = u32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]]);
        h = (h ^ w).wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        i += 1;
    }
    h = (h ^ u32::from_le_bytes(*ports)).wrapping_mul(0xc2b2_ae35);
    h ^ h >> 16
}

/// The bytes the outer headers add: an IPv6 header (40: an IPv6 outer
/// header is IPIP's only, the policy allows no other), or an IPv4 one
/// (20) and for FOU a UDP header, for GUE a UDP header and GUE's 4
/// bytes.
#[must_use]
#[inline(always)]
pub const fn overhead(encap: u8, v6: bool) -> usize {
    if v6 {
        return 40;
    }
    match encap {
        encap::FOU => 28,
        encap::GUE => 32,
        _ => 20,
    }
}

/// The bytes an ICMP "too big" answer quotes of the packet: its IPv4
/// header (without options) and 8 bytes, or its IPv6 header and 8 bytes.
pub const QUOTE_V4: usize = 28;
pub const QUOTE_V6: usize = 48;
/// The answer's frame: Ethernet, IP, ICMP (8), the quote.
pub const ICMP_FRAME_V4: usize = 14 + 20 + 8 + QUOTE_V4;
pub const ICMP_FRAME_V6: usize = 14 + 40 + 8 + QUOTE_V6;

/// `sum` plus the 16-bit big-endian words of `bytes` (of even length),
/// not folded.
#[must_use]
#[inline(always)]
pub const fn sum_words(bytes: &[u8], mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        sum += u16::from_be_bytes([bytes[i], bytes[i + 1]]) as u32;
        i += 2;
    }
    sum
}

/// A sum of words folded to 16 bits and inverted: the checksum field.
#[must_use]
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits")]
    let folded = sum as u16;
    !folded
}

/// The one's-complement sum of `words` folded to 16 bits and inverted:
/// an IPv4 header's checksum (its checksum field 0 in `words`).
#[must_use]
#[inline(always)]
pub const fn ipv4_checksum(h: &[u8; 20]) -> u16 {
    fold(sum_words(h, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_with_its_checksum_sums_to_all_ones() {
        let mut h = [0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 4, 0, 0, 198, 18, 1, 1, 198, 18, 2, 2];
        let c = ipv4_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(ipv4_checksum(&h), 0, "a header with a right checksum sums to 0xffff");
        h[8] = 63;
        assert_ne!(ipv4_checksum(&h), 0);
    }

    #[test]
    fn an_icmpv6_checksum_covers_its_pseudo_header() {
        // An ICMPv6 echo request of 4 payload bytes, checked against the
        // same sum computed with the checksum in place (all ones).
        let (src, dst) = (
            [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10],
            [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        let mut msg = [128u8, 0, 0, 0, 0, 1, 0, 1, 1, 2, 3, 4];
        let pseudo = |msg: &[u8]| sum_words(msg, sum_words(&src, sum_words(&dst, 12 + 58)));
        let c = fold(pseudo(&msg));
        msg[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(fold(pseudo(&msg)), 0);
    }

    #[test]
    fn the_hash_moves_with_each_field() {
        let src = [198, 18, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let h = flow_hash(&src, &[0x30, 0x39, 0, 80], 6);
        let mut other = src;
        other[3] = 2;
        assert_ne!(h, flow_hash(&other, &[0x30, 0x39, 0, 80], 6));
        assert_ne!(h, flow_hash(&src, &[0x30, 0x3a, 0, 80], 6));
        assert_ne!(h, flow_hash(&src, &[0x30, 0x39, 0, 80], 17));
    }
}
