//! The maps the daemon writes, as a trait: the real data plane implements
//! it, and so does [`FakeMaps`], an in-memory stand-in with which the
//! daemon's policy logic (apply, runtime overrides, restore after a
//! restart) is tested on the host without root.

use limiter_common::{Config, RuntimeKey, RuntimeOverride};

use super::{DataPlane, LoadError, maps::Tables};
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
}
