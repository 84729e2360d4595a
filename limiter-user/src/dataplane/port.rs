//! The maps the daemon writes, as a trait: the real data plane implements
//! it, and so does [`FakeMaps`], an in-memory stand-in with which the
//! daemon's policy logic (apply, runtime overrides, restore after a
//! restart) is tested on the host without root.

use ipnet::IpNet;
use limiter_common::{Config, RuntimeKey, RuntimeOverride};

use super::{
    DataPlane, LoadError,
    deny::{DenyWrites, Pinned},
    groups::GroupWrites,
    maps::Tables,
};
use crate::policy::Compiled;

/// What the daemon reads and writes in the data plane.
pub trait PolicyMaps {
    /// Switch to `c` atomically (all of it or, on error, none).
    fn apply(&mut self, c: &Compiled) -> Result<(), LoadError>;
    /// The config in force, if any (a re-adopted data plane has one).
    fn active_config(&self) -> Result<Option<Config>, LoadError>;
    /// Every runtime override recorded.
    fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError>;
    /// Record (`Some`) or forget (`None`) one runtime override.
    fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError>;
    /// Write a change of the deny set, in its order.
    fn write_deny(&mut self, ch: &DenyWrites) -> Result<(), LoadError>;
    /// The deny set as pinned, and its origins' names.
    fn deny_pinned(&self) -> Result<Pinned, LoadError>;
    /// Record the deny set's origins' names.
    fn set_deny_origins(&mut self, names: &[String]) -> Result<(), LoadError>;
    /// Write a change of the group tries (then every bucket resolves
    /// again); the longest single write.
    fn write_groups(&mut self, w: &GroupWrites) -> Result<std::time::Duration, LoadError>;
    /// The group tries as pinned.
    fn groups_pinned(&self) -> Result<Vec<(IpNet, u32)>, LoadError>;
}

impl PolicyMaps for Tables {
    fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        Tables::apply(self, c)
    }
    fn active_config(&self) -> Result<Option<Config>, LoadError> {
        Tables::active_config(self)
    }
    fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        Tables::runtime_overrides(self)
    }
    fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        Tables::set_runtime_override(self, key, value)
    }
    fn write_deny(&mut self, ch: &DenyWrites) -> Result<(), LoadError> {
        Tables::write_deny(self, ch)
    }
    fn deny_pinned(&self) -> Result<Pinned, LoadError> {
        Tables::deny_pinned(self)
    }
    fn set_deny_origins(&mut self, names: &[String]) -> Result<(), LoadError> {
        Tables::set_deny_origins(self, names)
    }
    fn write_groups(&mut self, w: &GroupWrites) -> Result<std::time::Duration, LoadError> {
        Tables::write_groups(self, w)
    }
    fn groups_pinned(&self) -> Result<Vec<(IpNet, u32)>, LoadError> {
        Tables::groups_pinned(self)
    }
}

impl PolicyMaps for DataPlane {
    fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        self.maps.tables().apply(c)
    }
    fn active_config(&self) -> Result<Option<Config>, LoadError> {
        self.maps.tables.as_ref().map_or(Ok(None), Tables::active_config)
    }
    fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        self.maps.tables.as_ref().map_or(Ok(Vec::new()), Tables::runtime_overrides)
    }
    fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        self.maps.tables().set_runtime_override(key, value)
    }
    fn write_deny(&mut self, ch: &DenyWrites) -> Result<(), LoadError> {
        self.maps.tables().write_deny(ch)
    }
    fn deny_pinned(&self) -> Result<Pinned, LoadError> {
        self.maps.tables.as_ref().map_or(Ok(Pinned::default()), Tables::deny_pinned)
    }
    fn set_deny_origins(&mut self, names: &[String]) -> Result<(), LoadError> {
        self.maps.tables().set_deny_origins(names)
    }
    fn write_groups(&mut self, w: &GroupWrites) -> Result<std::time::Duration, LoadError> {
        self.maps.tables().write_groups(w)
    }
    fn groups_pinned(&self) -> Result<Vec<(IpNet, u32)>, LoadError> {
        self.maps.tables.as_ref().map_or(Ok(Vec::new()), Tables::groups_pinned)
    }
}

/// In-memory maps for host tests: records what was applied and can be
/// told to fail the next apply or runtime write, as a kernel might.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct FakeMaps {
    /// Every policy applied, in order.
    pub applied: Vec<Compiled>,
    pub runtime: std::collections::BTreeMap<[u8; 20], (RuntimeKey, RuntimeOverride)>,
    /// Fail the next `apply` (as a full map or a vanished pin would).
    pub fail_apply: bool,
    /// Fail the next runtime write.
    pub fail_runtime: bool,
    /// The deny set as written: entries, and origins' names.
    pub deny: std::collections::HashMap<limiter_common::deny::DenyKey, u32>,
    pub deny_origins: Vec<String>,
    /// The group tries as written.
    pub groups: std::collections::BTreeMap<IpNet, u32>,
}

#[cfg(any(test, feature = "testing"))]
fn fake_error(what: &'static str) -> LoadError {
    LoadError::Map { map: what, source: aya::maps::MapError::KeyNotFound }
}

#[cfg(any(test, feature = "testing"))]
fn runtime_id(k: &RuntimeKey) -> [u8; 20] {
    let mut id = [0; 20];
    id[0] = k.family.0;
    id[1] = k.prefix_len;
    // Every byte of the key, as the kernel's hash map compares them.
    id[2..4].copy_from_slice(&k.pad);
    id[4..].copy_from_slice(&k.addr);
    id
}

#[cfg(any(test, feature = "testing"))]
impl PolicyMaps for FakeMaps {
    fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        if std::mem::take(&mut self.fail_apply) {
            return Err(fake_error("CONFIG"));
        }
        self.applied.push(c.clone());
        Ok(())
    }
    fn active_config(&self) -> Result<Option<Config>, LoadError> {
        Ok(self.applied.last().map(|c| c.config))
    }
    fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        Ok(self.runtime.values().copied().collect())
    }
    fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        if std::mem::take(&mut self.fail_runtime) {
            return Err(fake_error("RUNTIME"));
        }
        match value {
            Some(v) => self.runtime.insert(runtime_id(key), (*key, *v)),
            None => self.runtime.remove(&runtime_id(key)),
        };
        Ok(())
    }
    fn write_deny(&mut self, ch: &DenyWrites) -> Result<(), LoadError> {
        for (k, v) in &ch.upserts {
            self.deny.insert(*k, *v);
        }
        for k in &ch.deletes {
            self.deny.remove(k);
        }
        Ok(())
    }
    fn deny_pinned(&self) -> Result<Pinned, LoadError> {
        let lens = limiter_common::deny::DenyLens::default();
        Ok(Pinned {
            entries: self.deny.iter().map(|(k, v)| (*k, *v)).collect(),
            names: self.deny_origins.clone(),
            lens,
        })
    }
    fn set_deny_origins(&mut self, names: &[String]) -> Result<(), LoadError> {
        self.deny_origins = names.to_vec();
        Ok(())
    }
    fn write_groups(&mut self, w: &GroupWrites) -> Result<std::time::Duration, LoadError> {
        for (n, i) in &w.upserts {
            self.groups.insert(*n, *i);
        }
        for n in &w.deletes {
            self.groups.remove(n);
        }
        Ok(std::time::Duration::ZERO)
    }
    fn groups_pinned(&self) -> Result<Vec<(IpNet, u32)>, LoadError> {
        Ok(self.groups.iter().map(|(n, i)| (*n, *i)).collect())
    }
}
