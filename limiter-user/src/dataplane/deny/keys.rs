//! A network and the deny set's key of it, one to the other.

use ipnet::IpNet;
use limiter_common::{deny::DenyKey, family};

/// The key of a network.
#[must_use]
pub fn key_of(net: &IpNet) -> DenyKey {
    let (fam, addr) = match net.addr() {
        std::net::IpAddr::V4(a) => (family::IPV4, [u32::from_ne_bytes(a.octets()), 0, 0, 0]),
        std::net::IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            (family::IPV6, [w(0), w(4), w(8), w(12)])
        }
    };
    DenyKey::of(fam, addr, u32::from(net.prefix_len()))
}

/// The network of a key.
#[must_use]
pub fn net_of(k: &DenyKey) -> IpNet {
    let b = |w: u32| w.to_ne_bytes();
    let addr: std::net::IpAddr = if k.family == family::IPV4 {
        std::net::Ipv4Addr::from(b(k.addr[0])).into()
    } else {
        let mut o = [0u8; 16];
        for (i, w) in k.addr.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&b(*w));
        }
        std::net::Ipv6Addr::from(o).into()
    };
    IpNet::new(addr, k.len).unwrap_or_else(|_| IpNet::from(addr))
}
