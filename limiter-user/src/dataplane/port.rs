//! The maps the daemon writes, as a trait: the real data plane implements
//! it, and so does [`FakeMaps`], an in-memory stand-in with which the
//! daemon's policy logic (apply, runtime overrides, restore after a
//! restart) is tested on the host without root.

use limiter_common::{ClassCounters, Config, MAX_CLASSES, RuntimeKey, RuntimeOverride};

use super::{DataPlane, LoadError, Totals};
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
    /// Counters per reason, summed over CPUs.
    fn totals(&self) -> Result<Totals, LoadError>;
    /// Counters per class, summed over CPUs.
    fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError>;
}

impl PolicyMaps for DataPlane {
    fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        self.maps.apply(c)
    }
    fn active_config(&self) -> Result<Option<Config>, LoadError> {
        self.maps.active_config()
    }
    fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        self.maps.runtime_overrides()
    }
    fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        self.maps.set_runtime_override(key, value)
    }
    fn totals(&self) -> Result<Totals, LoadError> {
        self.maps.totals()
    }
    fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError> {
        self.maps.class_totals()
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
    pub totals: Totals,
    pub classes: [ClassCounters; MAX_CLASSES],
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
    id[0] = k.family;
    id[1] = k.prefix_len;
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
    fn totals(&self) -> Result<Totals, LoadError> {
        Ok(self.totals)
    }
    fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError> {
        Ok(self.classes)
    }
}
