//! The window quotas of the policy in force, as the sync needs them: which
//! window (a class's, or a window override's) counts a bucket key.

use limiter_common::BucketKey;

use crate::dataplane::key_addr;

/// A window quota (of a class or an override) as the sync needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassWindow {
    /// Names its keys in the store: the class, or `override:CIDR`.
    pub name: String,
    pub limit: u64,
    pub slice_ns: u64,
    pub slices: u32,
    pub fleet: bool,
}

/// The window quotas of the policy in force.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Classes {
    /// By class index (`None`: not a window quota).
    pub by_index: Vec<Option<ClassWindow>>,
    /// Window overrides of the default class, most specific first.
    pub overrides: Vec<(ipnet::IpNet, ClassWindow)>,
}

impl Classes {
    /// The window that counts `key`: for the default class the most
    /// specific window override containing its prefix (the program only
    /// counts a prefix in a window when that is what it resolved to),
    /// else its class's.
    #[must_use]
    pub fn of(&self, key: &BucketKey) -> Option<&ClassWindow> {
        if key.class == 0
            && let Some(addr) = key_addr(key)
            && let Some((_, w)) = self.overrides.iter().find(|(n, _)| n.contains(&addr))
        {
            return Some(w);
        }
        self.by_index.get(usize::from(key.class))?.as_ref()
    }

    /// The shortest slice of a fleet-scope window quota, in ns.
    #[must_use]
    pub fn finest_fleet_slice_ns(&self) -> Option<u64> {
        self.by_index
            .iter()
            .flatten()
            .chain(self.overrides.iter().map(|(_, w)| w))
            .filter(|w| w.fleet)
            .map(|w| w.slice_ns)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::family;

    use super::*;

    fn window(name: &str) -> ClassWindow {
        ClassWindow { name: name.into(), limit: 60, slice_ns: 500_000_000, slices: 12, fleet: true }
    }

    #[test]
    fn a_default_class_prefix_is_counted_by_its_most_specific_window_override() {
        let c = Classes {
            by_index: vec![None, Some(window("syn"))],
            overrides: vec![
                ("198.18.5.0/24".parse().unwrap(), window("override:198.18.5.0/24")),
                ("198.18.0.0/16".parse().unwrap(), window("override:198.18.0.0/16")),
            ],
        };
        let key = |a: [u8; 4], class| BucketKey {
            family: family::IPV4,
            prefix_len: 24,
            class,
            pad: 0,
            addr: [u32::from_ne_bytes(a), 0],
        };
        let name = |k| c.of(&k).map(|w| w.name.clone());
        assert_eq!(name(key([198, 18, 5, 0], 0)).as_deref(), Some("override:198.18.5.0/24"));
        assert_eq!(name(key([198, 18, 9, 0], 0)).as_deref(), Some("override:198.18.0.0/16"));
        assert_eq!(name(key([198, 19, 9, 0], 0)), None);
        assert_eq!(name(key([198, 18, 5, 0], 1)).as_deref(), Some("syn"), "classes are not overridden");
    }
}
