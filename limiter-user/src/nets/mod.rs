//! What the sources of networks share: the special-purpose networks no
//! public source has ([`bogons`]), and networks left no finer than a
//! bucket prefix ([`coarsen`]). Feeds, groups and CrowdSec use them; none
//! imports another.

pub mod bogons;

use ipnet::IpNet;

/// `nets` without those finer than a bucket prefix (`v4`, and `v6` at
/// most /64): a bucket prefix is in a group only when the group holds
/// all of it. Returns the networks kept and how many were left out.
#[must_use]
pub fn coarsen(nets: Vec<IpNet>, v4: u32, v6: u32) -> (std::collections::HashSet<IpNet>, usize) {
    let v6 = v6.min(limiter_common::MAX_V6_BUCKET_PREFIX);
    let total = nets.len();
    let kept: std::collections::HashSet<IpNet> = nets
        .into_iter()
        .filter(|n| {
            u32::from(n.prefix_len())
                <= match n {
                    IpNet::V4(_) => v4,
                    IpNet::V6(_) => v6,
                }
        })
        .collect();
    let left = total - kept.len();
    (kept, left)
}

/// `::ffff:a.b.c.d/n` (n >= 96) as `a.b.c.d/(n - 96)`.
#[must_use]
pub fn unmapped(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && v6.prefix_len() >= 96
        && let Some(v4) = std::net::Ipv6Addr::to_ipv4_mapped(&v6.addr())
    {
        return IpNet::new(std::net::IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net);
    }
    net
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn networks_finer_than_a_bucket_prefix_are_left_out_and_counted() {
        let (kept, left) = coarsen(nets(&["198.18.0.0/23", "198.18.2.0/25", "2001:2::/48", "2001:2:0:1::/72"]), 24, 56);
        assert_eq!(left, 2);
        assert!(kept.contains(&"198.18.0.0/23".parse().unwrap()) && kept.contains(&"2001:2::/48".parse().unwrap()));
    }
}
