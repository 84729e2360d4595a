//! Networks no public source has (RFC 6890's special-purpose registries:
//! private, shared, loopback, link-local, documentation, benchmarking,
//! multicast and reserved space). A feed that lists one (FireHOL level1
//! does, through fullbogons) would deny this host's own LAN, its
//! loopback or its carrier's CGNAT; a feed entry that overlaps one is
//! refused unless the feed allows it.

use ipnet::IpNet;

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
