//! PROXY protocol headers as haproxy's `doc/proxy-protocol.txt` defines
//! them: version 1 (one text line) and version 2 (binary, with TLVs).
//!
//! Version 2 carries two TLVs: `PP2_TYPE_UNIQUE_ID` (0x05, this
//! connection's id, 8 bytes) and this limiter's application TLV
//! [`PP2_TYPE_LIMITER`] (0xE0, in the range the spec reserves for
//! applications), whose value is, big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format of this TLV, 1 |
//! | 8 | policy version the data plane enforces |
//! | 1 | rule class the connection's SYN was charged to (0 = default) |
//! | 1 | flags: bit 0 = that class is in shadow mode |
//! | 1 | address family of the prefix, 4 or 6 |
//! | 1 | prefix length |
//! | 16 | prefix address (IPv4 in the first 4 bytes) |
//! | 8 | allowance left in the prefix's bucket for that class, in units (packets or bytes); `u64::MAX` when unknown |
//!
//! 37 bytes in all. A receiver must accept the header only from trusted
//! peers (the spec's rule): the backend should listen where only the
//! forwarder can reach it.

use std::net::{IpAddr, SocketAddr};

/// The version 2 signature.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Standard TLV: a unique id of the connection.
pub const PP2_TYPE_UNIQUE_ID: u8 = 0x05;
/// This limiter's application TLV.
pub const PP2_TYPE_LIMITER: u8 = 0xE0;
/// Length of the application TLV's value.
pub const LIMITER_TLV_LEN: usize = 37;

/// What the limiter tells the backend about a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub policy_version: u64,
    pub class: u8,
    pub shadow: bool,
    /// 4 or 6.
    pub family: u8,
    pub prefix_len: u8,
    pub prefix: [u8; 16],
    /// Units left in the bucket; `u64::MAX` when unknown (an override's
    /// limits, or a window quota).
    pub remaining: u64,
}

impl Verdict {
    /// The application TLV's value.
    #[must_use]
    pub fn encode(&self) -> [u8; LIMITER_TLV_LEN] {
        let mut v = [0u8; LIMITER_TLV_LEN];
        v[0] = 1;
        v[1..9].copy_from_slice(&self.policy_version.to_be_bytes());
        v[9] = self.class;
        v[10] = u8::from(self.shadow);
        v[11] = self.family;
        v[12] = self.prefix_len;
        v[13..29].copy_from_slice(&self.prefix);
        v[29..37].copy_from_slice(&self.remaining.to_be_bytes());
        v
    }

    /// Back from [`Verdict::encode`]; `None` for another format or length.
    #[must_use]
    pub fn decode(v: &[u8]) -> Option<Self> {
        if v.len() != LIMITER_TLV_LEN || v[0] != 1 {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(v[i..i + 8].try_into().expect("8 bytes"));
        Some(Self {
            policy_version: u64_at(1),
            class: v[9],
            shadow: v[10] & 1 != 0,
            family: v[11],
            prefix_len: v[12],
            prefix: v[13..29].try_into().expect("16 bytes"),
            remaining: u64_at(29),
        })
    }
}

/// A version 1 header: `PROXY TCP4 src dst sport dport\r\n`.
#[must_use]
pub fn v1(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (src, dst) = same_family(src, dst);
    let proto = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    format!("PROXY {proto} {} {} {} {}\r\n", src.ip(), dst.ip(), src.port(), dst.port()).into_bytes()
}

/// A version 2 header with the unique id and the limiter's TLV.
#[must_use]
pub fn v2(src: SocketAddr, dst: SocketAddr, id: u64, verdict: &Verdict) -> Vec<u8> {
    let (src, dst) = same_family(src, dst);
    let mut body = Vec::with_capacity(36 + 11 + 3 + LIMITER_TLV_LEN);
    let fam = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            body.extend_from_slice(&s.octets());
            body.extend_from_slice(&d.octets());
            0x11 // TCP over IPv4
        }
        (s, d) => {
            body.extend_from_slice(&v6(s));
            body.extend_from_slice(&v6(d));
            0x21 // TCP over IPv6
        }
    };
    body.extend_from_slice(&src.port().to_be_bytes());
    body.extend_from_slice(&dst.port().to_be_bytes());
    tlv(&mut body, PP2_TYPE_UNIQUE_ID, &id.to_be_bytes());
    tlv(&mut body, PP2_TYPE_LIMITER, &verdict.encode());
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&SIGNATURE);
    out.push(0x21); // version 2, PROXY
    out.push(fam);
    out.extend_from_slice(&u16::try_from(body.len()).expect("a short header").to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&u16::try_from(value.len()).expect("a short TLV").to_be_bytes());
    out.extend_from_slice(value);
}

fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// Both addresses in one family (an IPv4 client on a dual-stack socket
/// arrives as IPv4-mapped IPv6).
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let plain = |a: SocketAddr| match a.ip() {
        IpAddr::V6(v) => v.to_ipv4_mapped().map_or(a, |v4| SocketAddr::new(IpAddr::V4(v4), a.port())),
        IpAddr::V4(_) => a,
    };
    let (s, d) = (plain(src), plain(dst));
    if s.is_ipv4() == d.is_ipv4() {
        return (s, d);
    }
    let widen = |a: SocketAddr| SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::from(v6(a.ip()))), a.port());
    (widen(s), widen(d))
}

/// A parsed version 2 header (for tests and backends written in Rust).
#[derive(Debug, PartialEq, Eq)]
pub struct Parsed {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub tlvs: Vec<(u8, Vec<u8>)>,
    /// Bytes the header took.
    pub len: usize,
}

/// Parse a version 2 header at the start of `b`; `None` if it is not one
/// or is incomplete.
#[must_use]
pub fn parse_v2(b: &[u8]) -> Option<Parsed> {
    if b.len() < 16 || b[..12] != SIGNATURE || b[12] != 0x21 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([b[14], b[15]]));
    let body = b.get(16..16 + len)?;
    let (src, dst, mut rest) = match b[13] {
        0x11 if len >= 12 => {
            let ip = |i: usize| IpAddr::from(<[u8; 4]>::try_from(&body[i..i + 4]).expect("4 bytes"));
            let port = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
            (SocketAddr::new(ip(0), port(8)), SocketAddr::new(ip(4), port(10)), &body[12..])
        }
        0x21 if len >= 36 => {
            let ip = |i: usize| IpAddr::from(<[u8; 16]>::try_from(&body[i..i + 16]).expect("16 bytes"));
            let port = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
            (SocketAddr::new(ip(0), port(32)), SocketAddr::new(ip(16), port(34)), &body[36..])
        }
        _ => return None,
    };
    let mut tlvs = Vec::new();
    while rest.len() >= 3 {
        let n = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        let value = rest.get(3..3 + n)?;
        tlvs.push((rest[0], value.to_vec()));
        rest = &rest[3 + n..];
    }
    Some(Parsed { src, dst, tlvs, len: 16 + len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_1_is_one_line() {
        let h = v1("198.18.5.7:40000".parse().unwrap(), "198.18.0.2:443".parse().unwrap());
        assert_eq!(h, b"PROXY TCP4 198.18.5.7 198.18.0.2 40000 443\r\n");
        let h = v1("[::ffff:198.18.5.7]:1".parse().unwrap(), "198.18.0.2:443".parse().unwrap());
        assert!(h.starts_with(b"PROXY TCP4 198.18.5.7 "), "{}", String::from_utf8_lossy(&h));
    }

    #[test]
    fn version_2_round_trips_with_its_tlvs() {
        let verdict = Verdict {
            policy_version: 7,
            class: 2,
            shadow: true,
            family: 6,
            prefix_len: 56,
            prefix: "2001:2:0:100::".parse::<std::net::Ipv6Addr>().unwrap().octets(),
            remaining: 1234,
        };
        let (src, dst) = ("[2001:2:0:100::9]:5555".parse().unwrap(), "[2001:2::2]:443".parse().unwrap());
        let h = v2(src, dst, 99, &verdict);
        assert_eq!(&h[..13], &[b'\r', b'\n', b'\r', b'\n', 0, b'\r', b'\n', b'Q', b'U', b'I', b'T', b'\n', 0x21]);
        assert_eq!(h[13], 0x21, "TCP over IPv6");
        let p = parse_v2(&h).unwrap();
        assert_eq!((p.src, p.dst, p.len), (src, dst, h.len()));
        assert_eq!(p.tlvs[0], (PP2_TYPE_UNIQUE_ID, 99u64.to_be_bytes().to_vec()));
        assert_eq!(p.tlvs[1].0, PP2_TYPE_LIMITER);
        assert_eq!(Verdict::decode(&p.tlvs[1].1), Some(verdict));
        let h4 = v2("198.18.5.7:1".parse().unwrap(), "198.18.0.2:443".parse().unwrap(), 1, &Verdict::default());
        assert_eq!((h4[13], u16::from_be_bytes([h4[14], h4[15]])), (0x11, 12 + 11 + 3 + 37));
    }
}
