//! The guards of a group's version, the feeds' turned to groups: no
//! network wider than the section's widths, no more of a family's
//! addresses than `max_coverage`, and against the version in force no
//! growth past `max_growth` nor shrink past `max_shrink` (a file replaced
//! by `0.0.0.0/0,XX`, or a one-node database, must neither deny the
//! Internet nor silently drop the group's real networks).

use ipnet::IpNet;

use super::section::Group;

/// The share of each family's address space a version covers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Coverage {
    pub v4: f64,
    pub v6: f64,
}

impl Coverage {
    /// What `nets` (disjoint, as a selection is) cover.
    pub fn of<'a>(nets: impl IntoIterator<Item = &'a IpNet>) -> Self {
        let mut c = Self::default();
        for n in nets {
            match n {
                IpNet::V4(n) => c.v4 += 2f64.powi(-i32::from(n.prefix_len())),
                IpNet::V6(n) => c.v6 += 2f64.powi(-i32::from(n.prefix_len())),
            }
        }
        c
    }
}

/// A share as a person reads it: `37.2%`, `0.0012%`.
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p >= 0.1 { format!("{p:.1}%") } else { format!("{p:.2e}%") }
}

/// Check a version's networks against `spec`'s guards and the coverage
/// of the version in force (`last`): its coverage, or why it is refused.
pub fn check<'a>(
    spec: &Group,
    nets: impl IntoIterator<Item = &'a IpNet> + Clone,
    last: Option<Coverage>,
) -> Result<Coverage, String> {
    // The widest, IPv4's first: the same version is refused with the
    // same words whatever order its set gives (a CI run saw `::/0` where
    // `0.0.0.0/0` was named before).
    let wide = nets
        .clone()
        .into_iter()
        .filter(|n| match n {
            IpNet::V4(n) => n.prefix_len() < spec.min_v4_prefix,
            IpNet::V6(n) => n.prefix_len() < spec.min_v6_prefix,
        })
        .min_by_key(|n| (n.addr().is_ipv6(), n.prefix_len(), **n));
    if let Some(n) = wide {
        let (key, min) = if n.addr().is_ipv4() {
            ("min_v4_prefix", spec.min_v4_prefix)
        } else {
            ("min_v6_prefix", spec.min_v6_prefix)
        };
        return Err(format!("the new version holds {n}, wider than /{min} ({key}): refused"));
    }
    let now = Coverage::of(nets);
    for (family, share, was) in [("IPv4", now.v4, last.map(|l| l.v4)), ("IPv6", now.v6, last.map(|l| l.v6))] {
        if share > spec.max_coverage {
            return Err(format!(
                "the new version covers {} of {family}, more than max_coverage ({}): refused",
                percent(share),
                percent(spec.max_coverage)
            ));
        }
        let Some(was) = was.filter(|w| *w > 0.0) else { continue };
        if share > was * (1.0 + spec.max_growth) {
            return Err(format!(
                "the new version covers {} of {family} where the last covered {}: it grew by more than max_growth \
                 ({}): refused",
                percent(share),
                percent(was),
                percent(spec.max_growth)
            ));
        }
        if share < was * (1.0 - spec.max_shrink) {
            return Err(format!(
                "the new version covers {} of {family} where the last covered {}: it shrank by more than max_shrink \
                 ({}; a truncated download?): refused",
                percent(share),
                percent(was),
                percent(spec.max_shrink)
            ));
        }
    }
    Ok(now)
}
