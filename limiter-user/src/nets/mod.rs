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

/// A new version of a set of networks (a feed's) that would drop more of
/// the set than allowed.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error(
    "the new version holds {new} networks where the last held {old}: it shrank by more than {}% (a truncated download?)",
    (max_shrink * 100.0).round()
)]
pub struct Shrunk {
    pub old: usize,
    pub new: usize,
    pub max_shrink: f64,
}

/// Refuse a new set of `new` networks replacing one of `old` when it lost
/// more than the fraction `max_shrink` of it (`1.0`: any shrink is taken).
pub fn check_shrink(old: usize, new: usize, max_shrink: f64) -> Result<(), Shrunk> {
    #[expect(clippy::cast_precision_loss, reason = "set sizes far inside f64's exact range")]
    let lost = old.saturating_sub(new) as f64 / old.max(1) as f64;
    if lost > max_shrink { Err(Shrunk { old, new, max_shrink }) } else { Ok(()) }
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

    #[test]
    fn a_version_that_lost_too_much_is_refused() {
        assert!(check_shrink(1000, 600, 0.5).is_ok());
        assert!(check_shrink(1000, 500, 0.5).is_ok());
        let e = check_shrink(1000, 499, 0.5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the new version holds 499 networks where the last held 1000: it shrank by more than 50% (a truncated download?)"
        );
        assert!(check_shrink(0, 0, 0.5).is_ok() && check_shrink(10, 0, 1.0).is_ok());
    }
}
