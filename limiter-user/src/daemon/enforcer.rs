//! The policy the daemon enforces: the base policy (file or built-in, with
//! the command-line overlay), the overrides set at run time, and the
//! version the data plane runs. Every change compiles the effective policy
//! once and writes it through [`PolicyMaps`], all or nothing (invariant 6);
//! runtime overrides are recorded in the pinned `RUNTIME` map before they
//! are applied, so a restarted daemon puts them back (invariant 5).

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
};

use ipnet::IpNet;
use limiter_common::maps::RUNTIME;

use crate::{
    control::PrefixEntry,
    dataplane::{LoadError, PolicyMaps},
    policy::{Compiled, Loaded, Origin, Override, OverrideAction, Policy, PolicyError, runtime},
};

/// Why a change was refused: the policy (nothing changed), the kernel,
/// or the request itself.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Request(String),
}

/// The policy state of a running daemon.
#[derive(Debug)]
pub struct Enforcer {
    /// The policy from the file (or built-in) with the command-line flags.
    base: Policy,
    /// Where `base` came from.
    source: String,
    /// Overrides set at run time: `Some` adds or replaces, `None` removes
    /// a file override. Merged over `base` on every apply.
    runtime: BTreeMap<IpNet, Option<OverrideAction>>,
    /// Version the data plane enforces.
    version: u64,
    /// Capacity of the bucket map in use (fixed until a restart).
    capacity: u32,
}

impl Enforcer {
    /// Continue from `version` (what a re-adopted data plane enforces, or
    /// 0) with a bucket map of `capacity`.
    #[must_use]
    pub fn new(version: u64, capacity: u32) -> Self {
        Self { base: Policy::default(), source: String::new(), runtime: BTreeMap::new(), version, capacity }
    }

    #[must_use]
    pub fn version(&self) -> u64 {
        self.version
    }

    #[must_use]
    pub fn base(&self) -> &Policy {
        &self.base
    }

    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `base` with the runtime overrides merged in: a file override keeps
    /// its place (replaced, or gone if unset at run time), runtime-only
    /// ones follow in address order.
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        let mut p = base.clone();
        let in_file: HashSet<IpNet> = base.overrides.iter().map(|o| o.net).collect();
        p.overrides = base
            .overrides
            .iter()
            .filter_map(|o| match self.runtime.get(&o.net) {
                None => Some(*o),
                Some(a) => a.map(|action| Override { net: o.net, action }),
            })
            .collect();
        p.overrides.extend(
            self.runtime
                .iter()
                .filter(|(net, _)| !in_file.contains(net))
                .filter_map(|(net, a)| a.map(|action| Override { net: *net, action })),
        );
        p
    }

    /// Apply `loaded` (with the runtime overrides) as the next version.
    /// Returns the summary line; on any error nothing changes.
    pub fn apply(&mut self, maps: &mut impl PolicyMaps, loaded: Loaded) -> Result<String, ApplyError> {
        let source = loaded.origin.name();
        self.install(maps, loaded.policy, source, &loaded.origin)
    }

    /// [`Enforcer::apply`] of a policy already compiled by
    /// [`Loaded::check`]: that compilation is used as it is when no runtime
    /// override changes the policy (the start of a daemon with nothing to
    /// put back), else the effective policy is compiled.
    pub fn apply_checked(
        &mut self,
        maps: &mut impl PolicyMaps,
        loaded: Loaded,
        checked: Compiled,
    ) -> Result<String, ApplyError> {
        let source = loaded.origin.name();
        let reuse = self.runtime.is_empty().then_some(checked);
        self.install_with(maps, loaded.policy, source, &loaded.origin, reuse)
    }

    fn install(
        &mut self,
        maps: &mut impl PolicyMaps,
        base: Policy,
        source: String,
        origin: &Origin,
    ) -> Result<String, ApplyError> {
        self.install_with(maps, base, source, origin, None)
    }

    fn install_with(
        &mut self,
        maps: &mut impl PolicyMaps,
        base: Policy,
        source: String,
        origin: &Origin,
        compiled: Option<Compiled>,
    ) -> Result<String, ApplyError> {
        let next = self.version + 1;
        let p = self.effective(&base);
        let compiled = match compiled {
            Some(mut c) => {
                c.config.version = next;
                c
            }
            None => p.compile(next).map_err(|e| origin.locate(e, &p))?,
        };
        maps.apply(&compiled)?;
        for w in p.warnings() {
            tracing::warn!(event = "policy_warning", version = next, "limiter: policy v{next}: {w}");
        }
        let mut summary = p.summary(next).to_string();
        if p.capacity != self.capacity {
            let _ = write!(summary, "; capacity stays {} until a restart", self.capacity);
        }
        (self.version, self.base, self.source) = (next, base, source);
        Ok(summary)
    }

    /// Add, replace or remove (`None`) one override as a new version.
    pub fn change_prefix(
        &mut self,
        maps: &mut impl PolicyMaps,
        cidr: &str,
        action: Option<OverrideAction>,
    ) -> Result<String, ApplyError> {
        let net = cidr.parse::<IpNet>().map_err(|e| ApplyError::Request(format!("{cidr:?} is not a CIDR: {e}")))?;
        let in_file = self.base.overrides.iter().any(|o| o.net == net);
        if action.is_none() && !self.runtime.contains_key(&net) && !in_file {
            return Err(ApplyError::Request(format!("{net} has no override")));
        }
        // Unsetting a runtime-only override forgets it; unsetting the
        // file's is an entry of its own (the file's override is removed).
        let entry = if action.is_none() && !in_file { None } else { Some(action) };
        let previous = self.runtime.get(&net).copied();
        // Recorded in the pinned RUNTIME map first, so a daemon that dies
        // right after the apply still puts it back when it restarts.
        self.record(maps, net, entry)?;
        let (base, source) = (self.base.clone(), self.source.clone());
        let result = self.install(maps, base, source, &Origin::BuiltIn);
        if result.is_err()
            && let Err(e) = self.record(maps, net, previous)
        {
            tracing::warn!("limiter: runtime override of {net} not restored in {RUNTIME}: {e}");
        }
        result
    }

    /// Set (`Some`) or forget (`None`) the runtime entry of `net`, in the
    /// `RUNTIME` map and then in memory.
    #[expect(clippy::option_option, reason = "an entry of `runtime`, whose values are optional themselves")]
    fn record(
        &mut self,
        maps: &mut impl PolicyMaps,
        net: IpNet,
        entry: Option<Option<OverrideAction>>,
    ) -> Result<(), LoadError> {
        let value = entry.map(|a| runtime::value(a.as_ref()));
        maps.set_runtime_override(&runtime::key(&net), value.as_ref())?;
        match entry {
            Some(a) => self.runtime.insert(net, a),
            None => self.runtime.remove(&net),
        };
        Ok(())
    }

    /// Put back the overrides a previous daemon set at run time (kept in
    /// the pinned `RUNTIME` map). Returns how many; entries this build
    /// cannot read are skipped with a warning.
    pub fn restore(&mut self, maps: &impl PolicyMaps) -> Result<usize, LoadError> {
        for (k, v) in maps.runtime_overrides()? {
            if let Some((net, action)) = runtime::decode(&k, &v) {
                self.runtime.insert(net, action);
            } else {
                tracing::warn!("limiter: skipped an unreadable entry of {RUNTIME}: {k:?}");
            }
        }
        Ok(self.runtime.len())
    }

    /// Drop restored runtime overrides that `base` cannot hold (a /24
    /// deny under a policy whose buckets are now /16, a limit no longer
    /// valid), from memory and from the `RUNTIME` map, so that they cannot
    /// keep a restarted daemon from starting. Returns each one with why.
    pub fn drop_unfit(&mut self, maps: &mut impl PolicyMaps, base: &Policy) -> Vec<String> {
        let unfit: Vec<(IpNet, String)> = self
            .runtime
            .iter()
            .filter_map(|(net, action)| {
                let bucket = if net.addr().is_ipv4() { base.v4_prefix } else { base.v6_prefix };
                if u32::from(net.prefix_len()) > bucket {
                    return Some((*net, format!("finer than the policy's /{bucket} buckets")));
                }
                match action {
                    Some(OverrideAction::Limit(l)) => l.to_kernel("").err().map(|e| (*net, e.to_string())),
                    _ => None,
                }
            })
            .collect();
        unfit
            .into_iter()
            .map(|(net, why)| {
                if let Err(e) = self.record(maps, net, None) {
                    tracing::warn!("limiter: {net} not removed from {RUNTIME}: {e}");
                    self.runtime.remove(&net);
                }
                format!("{net} ({why})")
            })
            .collect()
    }

    /// The overrides in force, with where each came from.
    #[must_use]
    pub fn prefixes(&self) -> Vec<PrefixEntry> {
        self.effective(&self.base)
            .overrides
            .iter()
            .map(|o| {
                let (action, rate, burst) = match o.action {
                    OverrideAction::Limit(l) => ("limit", Some(l.rate), Some(l.burst)),
                    OverrideAction::Allow => ("allow", None, None),
                    OverrideAction::Deny => ("deny", None, None),
                };
                PrefixEntry {
                    cidr: o.net.to_string(),
                    action: action.into(),
                    rate,
                    burst,
                    origin: if self.runtime.contains_key(&o.net) { "runtime" } else { "file" }.into(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
