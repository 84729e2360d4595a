//! TCP segments to and from port 443 for the SYN cookie tests: a client's
//! SYN as Linux sends it (any VLAN tags, IPv4 or IPv6), its ACK of a
//! cookie, and the checksums to check a SYN-ACK by.

use std::net::{IpAddr, Ipv4Addr};

use limiter::policy::{Class, CostUnit, Criticality, Limit, Mode, Policy, Protocol, SynCookies};

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x5e];
pub const SPORT: u16 = 40_123;
pub const ISN: u32 = 0x1122_3344;

/// One class of new TCP connections to 443 (10 a second, burst 20) with
/// SYN cookies `cookies` (`syn_rate` for `auto`), and `new_sources`.
#[must_use]
pub fn policy(cookies: SynCookies, syn_rate: Option<u64>, new_sources: Option<(u64, u64)>) -> Policy {
    Policy {
        classes: vec![Class {
            name: "https-syn".into(),
            protocol: Protocol::Tcp,
            ports: vec![(443, 443)],
            source_ports: Vec::new(),
            syn: true,
            limit: Limit { rate: 10, burst: 20, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
            syn_cookies: cookies,
            syn_rate,
            tcp_state: None,
            criticality: Criticality::Default,
        }],
        new_sources,
        ..Policy::default()
    }
}

/// One TCP segment from `src` (client) to `dst`:443 or back, with `vlans`
/// 802.1Q tags and the given flags, sequence numbers and options.
#[derive(Clone)]
pub struct Seg {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub vlans: usize,
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub options: Vec<u8>,
}

impl Seg {
    #[must_use]
    pub fn syn(src: IpAddr, vlans: usize) -> Self {
        let dst = match src {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
            IpAddr::V6(_) => IpAddr::V6("2001:2::2".parse().unwrap()),
        };
        // MSS 1460, SACK permitted, timestamps, window scale 7: a Linux SYN.
        let options = vec![2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7];
        Self { src, dst, vlans, flags: 0x02, seq: ISN, ack: 0, options }
    }

    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&SERVER_MAC);
        f.extend_from_slice(&CLIENT_MAC);
        for _ in 0..self.vlans {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
        }
        let tcp_len = 20 + self.options.len();
        let mut tcp = Vec::new();
        tcp.extend_from_slice(&SPORT.to_be_bytes());
        tcp.extend_from_slice(&443u16.to_be_bytes());
        tcp.extend_from_slice(&self.seq.to_be_bytes());
        tcp.extend_from_slice(&self.ack.to_be_bytes());
        tcp.push(u8::try_from(tcp_len / 4).unwrap() << 4);
        tcp.push(self.flags);
        tcp.extend_from_slice(&[0xfa, 0xf0, 0, 0, 0, 0]);
        tcp.extend_from_slice(&self.options);
        let csum = tcp_checksum(self.src, self.dst, &tcp);
        tcp[16..18].copy_from_slice(&csum.to_be_bytes());
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&[0x08, 0x00]);
                let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0];
                ip[2..4].copy_from_slice(&u16::try_from(20 + tcp_len).unwrap().to_be_bytes());
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                let c = checksum(&ip, 0);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                f.extend_from_slice(&ip);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
                f.extend_from_slice(&u16::try_from(tcp_len).unwrap().to_be_bytes());
                f.extend_from_slice(&[6, 64]);
                f.extend_from_slice(&s.octets());
                f.extend_from_slice(&d.octets());
            }
            _ => unreachable!("one family"),
        }
        f.extend_from_slice(&tcp);
        f
    }
}

/// RFC 1071 checksum of `bytes` on top of `acc`.
#[must_use]
pub fn checksum(bytes: &[u8], mut acc: u32) -> u16 {
    for w in bytes.chunks(2) {
        acc += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !u16::try_from(acc).unwrap()
}

/// TCP checksum with the pseudo-header of `src` → `dst`.
#[must_use]
pub fn tcp_checksum(src: IpAddr, dst: IpAddr, tcp: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    for a in [src, dst] {
        match a {
            IpAddr::V4(a) => pseudo.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => pseudo.extend_from_slice(&a.octets()),
        }
    }
    let mut acc = 6 + u32::try_from(tcp.len()).unwrap();
    for w in pseudo.chunks(2) {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    checksum(tcp, acc)
}

/// The client's ACK of a SYN-ACK carrying `cookie`.
#[must_use]
pub fn ack_of(syn: &Seg, cookie: u32) -> Seg {
    Seg { flags: 0x10, seq: ISN.wrapping_add(1), ack: cookie.wrapping_add(1), options: vec![], ..syn.clone() }
}
