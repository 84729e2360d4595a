//! The policy the daemon enforces: the base policy (file or built-in, with
//! the command-line overlay), the overrides set at run time, and the
//! version the data plane runs. Every change compiles the effective policy
//! once and writes it through [`PolicyMaps`], all or nothing (invariant 6);
//! runtime overrides are recorded in the pinned `RUNTIME` map before they
//! are applied, so a restarted daemon puts them back (invariant 5).

use std::fmt::Write as _;

use ipnet::IpNet;

pub use super::error::ApplyError;
use crate::{
    control::PrefixEntry,
    dataplane::{LoadError, PolicyMaps},
    origin::Origin,
    policy::{Compiled, Loaded, OverrideAction, Policy, Provenance},
};

/// An override set at run time: `None` removes a file override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeEntry {
    pub action: Option<OverrideAction>,
    /// Unix time (seconds) it expires; `None` = never.
    pub expires: Option<u64>,
    /// Who set it.
    pub by: Origin,
}

/// The policy state of a running daemon.
#[derive(Debug)]
pub struct Enforcer {
    /// The policy from the file (or built-in) with the command-line flags.
    base: Policy,
    /// Where `base` came from.
    source: String,
    /// The SHA-256 of that file's text (none: the built-in policy).
    file_sha256: Option<String>,
    /// The runtime layers over `base`: the operator's overrides and
    /// automation's (see [`Layers`]).
    pub(crate) layers: Layers,
    /// Version the data plane enforces.
    version: u64,
    /// Capacity of the bucket map in use (fixed until a restart).
    capacity: u32,
    /// The kernel form of the policy in force, once one was applied.
    config: Option<limiter_common::Config>,
    /// Why the running policy's SYN cookies are off, if it asks for them
    /// and the kernel would not accept them.
    syn_cookies_off: Option<String>,
    /// What the kernel lacks for SYN cookies, when the program runs
    /// without them (see [`kernel`]).
    pub kernel_lacks_cookies: Option<String>,
    /// The deny set and its sources (feeds, CrowdSec; see `deny.rs`).
    pub(crate) deny: deny::DenyLayer,
    /// The country and ASN groups' networks (see `groups.rs`).
    pub(crate) groups: crate::groups::layer::GroupLayer,
}

impl Enforcer {
    /// Continue from `version` (what a re-adopted data plane enforces, or
    /// 0) with a bucket map of `capacity`.
    #[must_use]
    pub fn new(version: u64, capacity: u32) -> Self {
        Self {
            base: Policy::default(),
            source: String::new(),
            file_sha256: None,
            layers: Layers::default(),
            version,
            capacity,
            config: None,
            syn_cookies_off: None,
            kernel_lacks_cookies: None,
            deny: deny::DenyLayer::default(),
            groups: crate::groups::layer::GroupLayer::default(),
        }
    }

    #[must_use]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Why the policy's SYN cookies are off (the kernel would not accept
    /// them), if it has any.
    #[must_use]
    pub fn syn_cookies_off(&self) -> Option<&str> {
        self.syn_cookies_off.as_deref()
    }

    /// The kernel form of the policy in force.
    #[must_use]
    pub fn config(&self) -> Option<&limiter_common::Config> {
        self.config.as_ref()
    }

    #[must_use]
    pub fn base(&self) -> &Policy {
        &self.base
    }

    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The SHA-256 of the policy file's text in force (none: built in).
    #[must_use]
    pub fn file_sha256(&self) -> Option<&str> {
        self.file_sha256.as_deref()
    }

    /// `base` with the runtime overrides merged in (see
    /// [`Layers::effective`]).
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        self.layers.effective(base)
    }

    /// Apply `loaded` (with the runtime overrides) as the next version.
    /// Returns the summary line; on any error nothing changes.
    pub fn apply(&mut self, maps: &mut impl PolicyMaps, loaded: Loaded) -> Result<String, ApplyError> {
        let source = loaded.provenance.name();
        let sha = loaded.provenance.sha256();
        let summary = self.install(maps, loaded.policy, source, &loaded.provenance)?;
        self.file_sha256 = sha;
        Ok(summary)
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
        let source = loaded.provenance.name();
        self.file_sha256 = loaded.provenance.sha256();
        let reuse = (self.layers.entries.is_empty() && self.layers.sources.sets().next().is_none()).then_some(checked);
        self.install_with(maps, loaded.policy, source, &loaded.provenance, reuse)
    }

    fn install(
        &mut self,
        maps: &mut impl PolicyMaps,
        base: Policy,
        source: String,
        provenance: &Provenance,
    ) -> Result<String, ApplyError> {
        self.install_with(maps, base, source, provenance, None)
    }

    fn install_with(
        &mut self,
        maps: &mut impl PolicyMaps,
        base: Policy,
        source: String,
        provenance: &Provenance,
        compiled: Option<Compiled>,
    ) -> Result<String, ApplyError> {
        let next = self.version + 1;
        let p = self.effective(&base);
        let mut compiled = match compiled {
            Some(mut c) => {
                c.config.version = next;
                c
            }
            None => p.compile(next).map_err(|e| provenance.locate(e, &p))?,
        };
        let (cookies_off, mss_only) = kernel::cookies(&p, &mut compiled, self.kernel_lacks_cookies.as_deref())
            .map_err(|e| provenance.locate(e, &p))?;
        self.write_policy(maps, &compiled, &p)?;
        self.config = Some(compiled.config);
        for w in p.warnings() {
            tracing::warn!(event = "policy_warning", version = next, "limiter: policy v{next}: {w}");
        }
        let mut summary = p.summary(next).to_string();
        if let Some(why) = &cookies_off {
            tracing::warn!(
                event = "syn_cookies_off",
                version = next,
                "limiter: policy v{next}: syn cookies are off: {why}"
            );
            let _ = write!(summary, "; syn cookies OFF: {why}");
        }
        if let Some(why) = &mss_only {
            tracing::info!(event = "syn_cookies_mss_only", version = next, "limiter: policy v{next}: {why}");
            let _ = write!(summary, "; syn cookies: MSS only");
        }
        self.syn_cookies_off = cookies_off;
        if p.capacity != self.capacity {
            let _ = write!(summary, "; capacity stays {} until a restart", self.capacity);
        }
        self.layers.sources.follow(&base);
        (self.version, self.base, self.source) = (next, base, source);
        Ok(summary)
    }

    /// Add, replace or remove (`None`) the operator's override of one
    /// network as a new version; a `ttl` makes it expire (see
    /// [`Enforcer::expire`]). Automation's entries on the same network are
    /// kept beneath it, except that an unset with no operator or file
    /// entry left to remove lifts them, or the network's escalation (the
    /// operator outranks automation).
    pub fn change_prefix(
        &mut self,
        maps: &mut impl PolicyMaps,
        net: IpNet,
        action: Option<OverrideAction>,
        ttl: Option<u64>,
        reason: Option<&str>,
    ) -> Result<String, ApplyError> {
        if action.is_some() {
            self.operator_net(net)?;
        }
        let summary = self.change_operator(maps, net, action, ttl)?;
        match reason.filter(|_| action.is_some()) {
            Some(r) => self.layers.reasons.insert(net, r.to_owned()),
            None => self.layers.reasons.remove(&net),
        };
        Ok(summary)
    }

    /// [`Enforcer::change_prefix`] without the reason.
    fn change_operator(
        &mut self,
        maps: &mut impl PolicyMaps,
        net: IpNet,
        action: Option<OverrideAction>,
        ttl: Option<u64>,
    ) -> Result<String, ApplyError> {
        let in_file = self.base.overrides.iter().any(|o| o.net == net);
        let expires = ttl.map(|t| crate::clock::unix_now() + t);
        let changes = self.layers.operator(net, action, expires, in_file);
        if changes.is_empty() {
            return self
                .layers
                .escalations
                .unset(&mut self.deny, maps, net)
                .unwrap_or_else(|| Err(ApplyError::Request(format!("{net} has no override"))));
        }
        self.change_entries(maps, &changes)
    }

    /// The operator's `net` as an override may take it, refused in the
    /// words the operator typed (the compile would name the override's
    /// index in the effective policy, which the operator never wrote).
    fn operator_net(&self, net: IpNet) -> Result<(), ApplyError> {
        crate::policy::compile::override_net(net, self.base.v4_prefix, self.base.v6_prefix).map_err(ApplyError::Request)
    }

    /// Unset every entry of the layers `origins` (the operator's,
    /// feedback's; escalation's are lifted from the deny set) as one new
    /// version; refused when none has any.
    pub fn unset_all(&mut self, maps: &mut impl PolicyMaps, origins: &[Origin]) -> Result<String, ApplyError> {
        if let Some(o) = origins.iter().find(|o| !matches!(o, Origin::Operator | Origin::Feedback | Origin::Escalation))
        {
            return Err(ApplyError::Request(format!(
                "{o}: only the operator's (runtime), feedback's and escalation's entries are unset at run time"
            )));
        }
        let changes: Vec<EntryWrite> =
            self.layers.entries.keys().filter(|(_, by)| origins.contains(by)).map(|k| (*k, None)).collect();
        let escalated: Vec<IpNet> = if origins.contains(&Origin::Escalation) {
            self.layers.escalations.nets.keys().copied().collect()
        } else {
            Vec::new()
        };
        if changes.is_empty() && escalated.is_empty() {
            let names: Vec<&str> = origins.iter().map(|o| o.label()).collect();
            return Err(ApplyError::Request(format!("no entry of {} to unset", names.join(", "))));
        }
        for net in &escalated {
            if let Some(Err(e)) = self.layers.escalations.unset(&mut self.deny, maps, *net) {
                return Err(e);
            }
        }
        let (n, lifted) = (changes.len(), escalated.len());
        self.layers.forget_reasons(&changes);
        let summary = self.change_entries(maps, &changes)?;
        Ok(format!("{n} entries unset, {lifted} escalations lifted; {summary}"))
    }

    /// Set `action` on every CIDR of `cidrs` as one new version, all or
    /// nothing: a bad entry is refused with its index and nothing changes.
    pub fn load(
        &mut self,
        maps: &mut impl PolicyMaps,
        cidrs: &[IpNet],
        action: OverrideAction,
        ttl: Option<u64>,
    ) -> Result<String, ApplyError> {
        let changes = bulk::changes(&self.base, cidrs, action, ttl)?;
        self.change_entries(maps, &changes)
    }

    /// Deny `cidr` for `ttl` seconds at the tenant layer's request (or the
    /// daemon's own escalation: `by`), if the governor allows it.
    pub fn penalize(
        &mut self,
        maps: &mut impl PolicyMaps,
        net: Result<&IpNet, &String>,
        ttl: u64,
        reason: &str,
        by: Origin,
    ) -> Result<String, ApplyError> {
        let (net, summary) = match feedback::judge(&mut self.layers, &self.base, net, ttl, reason, by)? {
            feedback::Judged::Shadow(summary) => return Ok(summary),
            feedback::Judged::Escalate(net, end) => {
                (net, self.layers.escalations.deny(&mut self.deny, maps, net, end, reason)?)
            }
            feedback::Judged::Deny(net, entry) => (net, self.change_entries(maps, &[((net, by), Some(entry))])?),
        };
        self.layers.governor.applied(net, ttl, reason, by);
        Ok(summary)
    }

    /// Forget the runtime overrides and escalations whose time is up at
    /// `now` (Unix seconds), as one new version; `None` when none is.
    pub fn expire(&mut self, maps: &mut impl PolicyMaps, now: u64) -> Option<Result<String, ApplyError>> {
        let lifted = self.layers.escalations.expire(&mut self.deny, maps, now);
        if let Some(Err(e)) = lifted {
            return Some(Err(e));
        }
        let due = self.layers.due(now);
        if due.is_empty() {
            return lifted;
        }
        Some(self.change_entries(maps, &due))
    }

    /// Put back the overrides and escalations a previous daemon set at run
    /// time (kept in the pinned `RUNTIME` map) and the deny set's sources
    /// as pinned. Returns how many overrides and escalations.
    pub fn restore(&mut self, maps: &mut impl PolicyMaps) -> Result<usize, LoadError> {
        let escalations = self.layers.restore(maps)?;
        self.deny.read_back(maps)?;
        self.groups.read_back(maps)?;
        let n = escalations.len();
        self.layers.escalations.restore(&mut self.deny, maps, escalations)?;
        Ok(self.layers.entries.len() + n)
    }

    /// Record `changes` in the runtime layers and apply, all or nothing:
    /// on any failure the records are put back as they were.
    fn change_entries(&mut self, maps: &mut impl PolicyMaps, changes: &[EntryWrite]) -> Result<String, ApplyError> {
        let undo = self.layers.record(maps, changes)?;
        let (base, source) = (self.base.clone(), self.source.clone());
        let result = self.install(maps, base, source, &Provenance::BuiltIn);
        if result.is_err() {
            self.layers.undo(maps, undo);
        }
        result
    }

    /// Put `nets` in force as the `[[source]]` `spec`'s new version (see
    /// [`SourceLayer::set`](crate::sources::layer::SourceLayer::set)) and
    /// apply the policy with it as a new version, all or nothing.
    pub fn source_version(
        &mut self,
        maps: &mut impl PolicyMaps,
        spec: &crate::sources::section::Source,
        nets: std::collections::BTreeSet<IpNet>,
    ) -> Result<String, ApplyError> {
        let count = nets.len();
        let old = self.layers.sources.set(spec, nets, crate::clock::unix_now()).map_err(ApplyError::Request)?;
        let (base, source) = (self.base.clone(), self.source.clone());
        match self.install(maps, base, source, &Provenance::BuiltIn) {
            Ok(summary) => Ok(format!("source {}: {count} networks ({}); {summary}", spec.name, spec.action())),
            Err(e) => {
                self.layers.sources.put_back(&spec.name, old);
                Err(e)
            }
        }
    }

    /// Put `nets` in the sources' layer as `spec`'s version before the
    /// first policy is applied (which applies them); returns how many.
    pub fn source_first(
        &mut self,
        spec: &crate::sources::section::Source,
        nets: std::collections::BTreeSet<IpNet>,
    ) -> Result<usize, String> {
        let n = nets.len();
        self.layers.sources.set(spec, nets, crate::clock::unix_now()).map(|_| n)
    }

    /// Each `[[source]]`'s version in force.
    pub fn source_sets(&self) -> impl Iterator<Item = (&String, &crate::sources::layer::Set)> {
        self.layers.sources.sets()
    }

    /// [`Enforcer::apply`] of a new version of the file (SIGHUP, `policy
    /// apply`), refused when it would take away too much at once (see
    /// [`shrink`]) unless the file sets `allow_shrink = true` or `force`.
    pub fn apply_guarded(
        &mut self,
        maps: &mut impl PolicyMaps,
        loaded: Loaded,
        force: bool,
    ) -> Result<String, ApplyError> {
        if !force
            && !loaded.policy.allow_shrink
            && self.config.is_some()
            && let Some(why) = shrink::shrink(&self.base, &loaded.policy)
        {
            return Err(ApplyError::Request(format!(
                "{why}: refused, as editors and config pushes truncate files; write `allow_shrink = true` in the \
                 file or run `limiter policy apply --force FILE` if it is meant"
            )));
        }
        self.apply(maps, loaded)
    }

    /// Write `compiled` (of `p`) with the deny set following it: its
    /// markers move with the bucket prefixes (the new ones written before
    /// the switch, the old ones removed after), and what the policy's
    /// sources no longer name is lifted.
    fn write_policy(&mut self, maps: &mut impl PolicyMaps, compiled: &Compiled, p: &Policy) -> Result<(), LoadError> {
        let (before, after) = self.deny.rebucket(compiled.config.v4_prefix, compiled.config.v6_prefix);
        maps.write_deny(&before)?;
        maps.apply(compiled)?;
        maps.write_deny(&after)?;
        self.groups.follow(maps, p)?;
        self.deny.follow(maps, p)
    }

    /// The deny set's layer.
    #[must_use]
    pub fn deny_layer(&self) -> &deny::DenyLayer {
        &self.deny
    }

    /// The deny set's layer, for a source's change (its own rules, over
    /// the set only: nothing it does reaches the layers above).
    pub fn deny_mut(&mut self) -> &mut deny::DenyLayer {
        &mut self.deny
    }

    /// The earliest end of a runtime override, a shadow decision, an
    /// escalation or a deny-set decision, if any.
    #[must_use]
    pub fn next_expiry(&self) -> Option<u64> {
        [self.layers.next_end(), self.deny.next_end()].into_iter().flatten().min()
    }

    /// Set aside restored runtime overrides that `base` cannot hold (see
    /// [`Layers::drop_unfit`]).
    pub fn drop_unfit(&mut self, base: &Policy) -> Vec<String> {
        self.layers.drop_unfit(base)
    }

    /// What escalation denies now.
    #[must_use]
    pub fn escalations(&self) -> &escalation::Escalations {
        &self.layers.escalations
    }

    /// What the feedback governor decided since the daemon started.
    #[must_use]
    pub fn governed(&self) -> &feedback::Governed {
        &self.layers.governor
    }

    /// The overrides in force, with where each came from, then the
    /// escalations and the feedback's shadow decisions.
    #[must_use]
    pub fn prefixes(&self) -> Vec<PrefixEntry> {
        self.layers.prefixes(&self.base)
    }
}

mod bulk;
pub mod deny;
pub mod escalation;
mod feedback;
pub(crate) mod kernel;
mod layers;
mod shrink;

use self::layers::EntryWrite;
pub use self::layers::Layers;

#[cfg(test)]
mod layer_tests;
#[cfg(test)]
mod tests;
