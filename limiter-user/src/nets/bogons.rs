//! Networks no public source has (RFC 6890's special-purpose registries:
//! private, shared, loopback, link-local, documentation, benchmarking,
//! multicast and reserved space). A feed that lists one (FireHOL level1
//! does, through fullbogons) would deny this host's own LAN, its
//! loopback or its carrier's CGNAT; a feed entry that overlaps one is
//! refused unless the feed allows it.

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

/// The special-purpose networks, IPv4 then IPv6.
pub const BOGONS: [&str; 28] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001:2::/48",
    "2001:10::/28",
    "2001:db8::/32",
    "3fff::/20",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

static PARSED: std::sync::LazyLock<Vec<IpNet>> =
    std::sync::LazyLock::new(|| BOGONS.iter().map(|b| b.parse().expect("a valid network")).collect());

/// The special-purpose network `net` overlaps (contains, or lies in), if
/// any.
#[must_use]
pub fn bogon_overlap(net: &IpNet) -> Option<IpNet> {
    PARSED.iter().find(|b| b.contains(net) || net.contains(*b)).copied()
}

/// `net` without the special-purpose networks: none if one holds it, the
/// rest cut into networks if it holds some.
#[must_use]
pub fn carve(net: IpNet) -> Vec<IpNet> {
    // Most networks touch none (one lookup of the parsed list).
    if bogon_overlap(&net).is_none() {
        return vec![net];
    }
    let inside: Vec<IpNet> = BOGONS
        .iter()
        .map(|b| b.parse::<IpNet>().expect("a valid network"))
        .filter(|b| b.contains(&net) || net.contains(b))
        .collect();
    if inside.is_empty() {
        return vec![net];
    }
    if inside.iter().any(|b| b.contains(&net)) {
        return Vec::new();
    }
    match net {
        IpNet::V4(n) => gaps(
            u32::from(n.network()),
            u32::from(n.broadcast()),
            inside.iter().filter_map(|b| match b {
                IpNet::V4(b) => Some((u32::from(b.network()), u32::from(b.broadcast()))),
                IpNet::V6(_) => None,
            }),
        )
        .into_iter()
        .flat_map(|(a, b)| Ipv4Subnets::new(a.into(), b.into(), 0).map(IpNet::V4))
        .collect(),
        IpNet::V6(n) => gaps(
            u128::from(n.network()),
            u128::from(n.broadcast()),
            inside.iter().filter_map(|b| match b {
                IpNet::V6(b) => Some((u128::from(b.network()), u128::from(b.broadcast()))),
                IpNet::V4(_) => None,
            }),
        )
        .into_iter()
        .flat_map(|(a, b)| Ipv6Subnets::new(a.into(), b.into(), 0).map(IpNet::V6))
        .collect(),
    }
}

/// The ranges of `start..=end` outside `holes` (each inside it).
fn gaps<T: Copy + Ord + num_step::Step>(start: T, end: T, holes: impl Iterator<Item = (T, T)>) -> Vec<(T, T)> {
    let mut holes: Vec<(T, T)> = holes.collect();
    holes.sort_unstable();
    let (mut out, mut from) = (Vec::new(), Some(start));
    for (a, b) in holes {
        if let Some(f) = from
            && a > f
        {
            out.push((f, a.before()));
        }
        from = if b >= end { None } else { Some(b.after()) };
    }
    if let Some(f) = from {
        out.push((f, end));
    }
    out
}

/// One address before or after, for the two address widths.
mod num_step {
    pub trait Step {
        fn before(self) -> Self;
        fn after(self) -> Self;
    }
    impl Step for u32 {
        fn before(self) -> Self {
            self - 1
        }
        fn after(self) -> Self {
            self + 1
        }
    }
    impl Step for u128 {
        fn before(self) -> Self {
            self - 1
        }
        fn after(self) -> Self {
            self + 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_ranges_are_special_purpose_and_public_space_is_not() {
        for n in ["198.18.0.0/15", "198.18.5.0/24", "2001:2::/48", "2001:2:0:5::/64", "192.168.1.1/32", "0.0.0.0/0"] {
            assert!(bogon_overlap(&n.parse().unwrap()).is_some(), "{n}");
        }
        for n in ["1.10.16.0/20", "8.8.8.8/32", "2a00:1450::/32", "2001:4860::/32"] {
            assert_eq!(bogon_overlap(&n.parse().unwrap()), None, "{n}");
        }
    }
}
