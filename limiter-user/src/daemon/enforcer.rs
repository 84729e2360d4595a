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
use limiter_common::{flags, maps::RUNTIME};

use crate::{
    control::{LayerEntry, PrefixEntry},
    dataplane::{LoadError, PolicyMaps},
    policy::{
        Compiled, Loaded, Origin, Override, OverrideAction, Policy, PolicyError,
        runtime::{self, SetBy},
    },
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
    /// Entry `index` of a bulk load (0-based) is refused; nothing changed.
    #[error("entry {index}: {message}")]
    Entry { index: usize, message: String },
    /// The feedback governor refused a penalty (`refusal`: its label).
    #[error("governor: {refusal}: {message}")]
    Governor { refusal: &'static str, message: String },
}

/// An override set at run time: `None` removes a file override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeEntry {
    pub action: Option<OverrideAction>,
    /// Unix time (seconds) it expires; `None` = never.
    pub expires: Option<u64>,
    /// Who set it.
    pub origin: SetBy,
}

/// The policy state of a running daemon.
#[derive(Debug)]
pub struct Enforcer {
    /// The policy from the file (or built-in) with the command-line flags.
    base: Policy,
    /// Where `base` came from.
    source: String,
    /// Overrides set at run time, one per network and layer (the
    /// operator's, then automation's): `Some` adds or replaces, `None`
    /// (the operator's only) removes a file override. Merged over `base`
    /// on every apply by [`Enforcer::in_force`]; a layer never replaces
    /// another's entry, so when one ends the one beneath is in force again.
    runtime: BTreeMap<(IpNet, SetBy), RuntimeEntry>,
    /// Version the data plane enforces.
    version: u64,
    /// Capacity of the bucket map in use (fixed until a restart).
    capacity: u32,
    /// The kernel form of the policy in force, once one was applied.
    config: Option<limiter_common::Config>,
    /// Why the running policy's SYN cookies are off, if it asks for them
    /// and the kernel would not accept them.
    syn_cookies_off: Option<String>,
    /// What the feedback governor decided (see `feedback.rs`).
    pub(super) governor: feedback::Governed,
}

impl Enforcer {
    /// Continue from `version` (what a re-adopted data plane enforces, or
    /// 0) with a bucket map of `capacity`.
    #[must_use]
    pub fn new(version: u64, capacity: u32) -> Self {
        Self {
            base: Policy::default(),
            source: String::new(),
            runtime: BTreeMap::new(),
            version,
            capacity,
            config: None,
            syn_cookies_off: None,
            governor: feedback::Governed::default(),
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

    /// `base` with the runtime overrides merged in, layer by layer (see
    /// [`Enforcer::in_force`]): a file override keeps its place (as the
    /// layers make it, or gone if the operator unset it), runtime-only
    /// ones follow in address order.
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        let mut p = base.clone();
        let in_file: HashSet<IpNet> = base.overrides.iter().map(|o| o.net).collect();
        p.overrides = base
            .overrides
            .iter()
            .filter_map(|o| self.in_force(base, o.net, Some(o.action)))
            .map(|(net, action, _)| Override { net, action })
            .collect();
        let mut runtime_only: Vec<IpNet> =
            self.runtime.keys().map(|(net, _)| *net).filter(|net| !in_file.contains(net)).collect();
        runtime_only.dedup();
        p.overrides.extend(
            runtime_only
                .into_iter()
                .filter_map(|net| self.in_force(base, net, None))
                .map(|(net, action, _)| Override { net, action }),
        );
        p
    }

    /// What is in force for `net` (whose file override is `file`) and which
    /// layer said it: the operator's entry, else the file's; automation (a
    /// penalty) overlays either unless it is a `deny` already, or an
    /// `allow` and the policy does not set `feedback.may_override_allow`.
    /// A penalty never removes what is beneath it: when it ends, that is
    /// in force again as it was.
    #[must_use]
    pub fn in_force(
        &self,
        base: &Policy,
        net: IpNet,
        file: Option<OverrideAction>,
    ) -> Option<(IpNet, OverrideAction, Layer)> {
        let upper = match self.runtime.get(&(net, SetBy::Operator)) {
            Some(e) => e.action.map(|a| (a, Layer::Operator)),
            None => file.map(|a| (a, Layer::File)),
        };
        let auto = self
            .runtime
            .range((net, SetBy::Feedback)..=(net, SetBy::Escalation))
            .find_map(|((_, by), e)| e.action.map(|a| (a, Layer::Automation(*by))));
        let may_override_allow = base.feedback.as_ref().is_some_and(|f| f.may_override_allow);
        let chosen = match (upper, auto) {
            (Some((OverrideAction::Deny, _)), _) | (Some(_), None) => upper,
            (Some((OverrideAction::Allow, _)), Some(_)) if !may_override_allow => upper,
            (_, a) => a,
        };
        chosen.map(|(a, l)| (net, a, l))
    }

    /// Apply `loaded` (with the runtime overrides) as the next version.
    /// Returns the summary line; on any error nothing changes.
    pub fn apply(&mut self, maps: &mut impl PolicyMaps, loaded: Loaded) -> Result<String, ApplyError> {
        let source = loaded.origin.name();
        self.install(maps, loaded.policy, source, &loaded.origin)
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
            && let Some(why) = shrink(&self.base, &loaded.policy)
        {
            return Err(ApplyError::Request(format!(
                "{why}: refused, as editors and config pushes truncate files; write `allow_shrink = true` in the \
                 file or run `limiter policy apply --force FILE` if it is meant"
            )));
        }
        self.apply(maps, loaded)
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
        let mut compiled = match compiled {
            Some(mut c) => {
                c.config.version = next;
                c
            }
            None => p.compile(next).map_err(|e| origin.locate(e, &p))?,
        };
        // Never claim protection that is not there: cookies the kernel would
        // not accept would only break the connections they answer.
        let cookies_off =
            (compiled.config.flags & flags::SYN_COOKIES != 0).then(super::os::syn_cookies_ready).and_then(Result::err);
        let mut mss_only = None;
        if cookies_off.is_some() {
            compiled.config.flags &= !flags::SYN_COOKIES;
        } else if compiled.config.flags & flags::SYN_COOKIES != 0 {
            let (opts, wscale, why) = super::os::cookie_options();
            (compiled.config.cookies.opts, compiled.config.cookies.wscale, mss_only) = (opts, wscale, why);
        }
        maps.apply(&compiled)?;
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
        (self.version, self.base, self.source) = (next, base, source);
        Ok(summary)
    }

    /// Add, replace or remove (`None`) the operator's override of one
    /// network as a new version; a `ttl` makes it expire (see
    /// [`Enforcer::expire`]). Automation's entries on the same network are
    /// kept beneath it, except that an unset with no operator or file
    /// entry left to remove lifts them (the operator outranks automation).
    pub fn change_prefix(
        &mut self,
        maps: &mut impl PolicyMaps,
        cidr: &str,
        action: Option<OverrideAction>,
        ttl: Option<u64>,
    ) -> Result<String, ApplyError> {
        let net = cidr.parse::<IpNet>().map_err(|e| ApplyError::Request(format!("{cidr:?} is not a CIDR: {e}")))?;
        let in_file = self.base.overrides.iter().any(|o| o.net == net);
        let operator = self.runtime.get(&(net, SetBy::Operator)).copied();
        let expires = ttl.map(|t| unix_now() + t);
        if action.is_some() {
            let entry = RuntimeEntry { action, expires, origin: SetBy::Operator };
            return self.change_entries(maps, &[((net, SetBy::Operator), Some(entry))]);
        }
        // Unset: a runtime-only override is forgotten; the file's is
        // removed by an entry of its own; with neither, automation's go.
        let changes: Vec<((IpNet, SetBy), Option<RuntimeEntry>)> = match (operator, in_file) {
            (Some(e), true) if e.action.is_none() => self.automation_of(net),
            (_, true) => {
                vec![((net, SetBy::Operator), Some(RuntimeEntry { action: None, expires, origin: SetBy::Operator }))]
            }
            (Some(_), false) => vec![((net, SetBy::Operator), None)],
            (None, false) => self.automation_of(net),
        };
        if changes.is_empty() {
            return Err(ApplyError::Request(format!("{net} has no override")));
        }
        for ((n, by), _) in &changes {
            if by.governed() {
                self.governor.reasons.remove(n);
            }
        }
        self.change_entries(maps, &changes)
    }

    /// Removals of automation's entries on `net`.
    fn automation_of(&self, net: IpNet) -> Vec<((IpNet, SetBy), Option<RuntimeEntry>)> {
        self.runtime.range((net, SetBy::Feedback)..=(net, SetBy::Escalation)).map(|(k, _)| (*k, None)).collect()
    }

    /// Record `changes` (`None` forgets an entry) and apply, all or
    /// nothing: on any failure the records are put back as they were.
    fn change_entries(
        &mut self,
        maps: &mut impl PolicyMaps,
        changes: &[((IpNet, SetBy), Option<RuntimeEntry>)],
    ) -> Result<String, ApplyError> {
        let previous: Vec<((IpNet, SetBy), Option<RuntimeEntry>)> =
            changes.iter().map(|(k, _)| (*k, self.runtime.get(k).copied())).collect();
        // Recorded in the pinned RUNTIME map first, so a daemon that dies
        // right after the apply still puts them back when it restarts.
        let mut done = 0;
        let mut result = Ok(());
        for (net, entry) in changes {
            if let Err(e) = self.record(maps, *net, *entry) {
                result = Err(ApplyError::from(e));
                break;
            }
            done += 1;
        }
        let result = result.and_then(|()| {
            let (base, source) = (self.base.clone(), self.source.clone());
            self.install(maps, base, source, &Origin::BuiltIn)
        });
        if result.is_err() {
            for (net, entry) in previous.iter().take(done).rev() {
                if let Err(e) = self.record(maps, *net, *entry) {
                    tracing::warn!("limiter: runtime override of {} not restored in {RUNTIME}: {e}", net.0);
                }
            }
        }
        result
    }

    /// Set (`Some`) or forget (`None`) the runtime entry of a network's
    /// layer, in the `RUNTIME` map and then in memory.
    fn record(
        &mut self,
        maps: &mut impl PolicyMaps,
        at: (IpNet, SetBy),
        entry: Option<RuntimeEntry>,
    ) -> Result<(), LoadError> {
        let value = entry.map(|e| {
            let expires = e.expires.map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX));
            runtime::value(e.action.as_ref(), expires, at.1)
        });
        maps.set_runtime_override(&runtime::key(&at.0, at.1), value.as_ref())?;
        match entry {
            Some(e) => self.runtime.insert(at, e),
            None => self.runtime.remove(&at),
        };
        Ok(())
    }

    /// Put back the overrides a previous daemon set at run time (kept in
    /// the pinned `RUNTIME` map). Returns how many; entries this build
    /// cannot read are skipped with a warning.
    pub fn restore(&mut self, maps: &mut impl PolicyMaps) -> Result<usize, LoadError> {
        for (k, v) in maps.runtime_overrides()? {
            if let Some((net, action, expires, origin)) = runtime::decode(&k, &v) {
                let expires = (expires != 0).then_some(u64::from(expires));
                let entry = RuntimeEntry { action, expires, origin };
                if runtime::stale_key(&k, origin) {
                    // A record of a build before layers: moved under its
                    // layer's key, so that its removal finds it.
                    maps.set_runtime_override(&k, None)?;
                    self.record(maps, (net, origin), Some(entry))?;
                }
                self.runtime.insert((net, origin), entry);
            } else {
                tracing::warn!("limiter: skipped an unreadable entry of {RUNTIME}: {k:?}");
            }
        }
        Ok(self.runtime.len())
    }

    /// What the feedback governor decided since the daemon started.
    #[must_use]
    pub fn governed(&self) -> &feedback::Governed {
        &self.governor
    }

    /// The overrides in force, with where each came from, then the
    /// feedback's shadow decisions.
    #[must_use]
    pub fn prefixes(&self) -> Vec<PrefixEntry> {
        let mut list = self.enforced();
        list.extend(self.governor.shadow_entries());
        list
    }

    /// One entry per network with an override in force (its top-level
    /// fields are the layer in force), listing every layer that spoke.
    fn enforced(&self) -> Vec<PrefixEntry> {
        let now = unix_now();
        let file: BTreeMap<IpNet, OverrideAction> = self.base.overrides.iter().map(|o| (o.net, o.action)).collect();
        self.effective(&self.base)
            .overrides
            .iter()
            .map(|o| {
                let (_, _, force) = self.in_force(&self.base, o.net, file.get(&o.net).copied()).unwrap_or((
                    o.net,
                    o.action,
                    Layer::File,
                ));
                let mut layers: Vec<LayerEntry> = Vec::new();
                let mut add = |layer: Layer, action: Option<OverrideAction>, expires: Option<u64>| {
                    layers.push(LayerEntry::new(layer, action, expires.map(|t| t.saturating_sub(now)), layer == force));
                };
                if let Some(e) = self.runtime.get(&(o.net, SetBy::Operator)) {
                    add(Layer::Operator, e.action, e.expires);
                }
                if let Some(a) = file.get(&o.net) {
                    add(Layer::File, Some(*a), None);
                }
                for ((_, by), e) in self.runtime.range((o.net, SetBy::Feedback)..=(o.net, SetBy::Escalation)) {
                    add(Layer::Automation(*by), e.action, e.expires);
                }
                let top = layers
                    .iter()
                    .find(|l| l.in_force)
                    .cloned()
                    .unwrap_or_else(|| LayerEntry::new(force, Some(o.action), None, true));
                PrefixEntry {
                    cidr: o.net.to_string(),
                    action: top.action,
                    rate: top.rate,
                    burst: top.burst,
                    origin: top.layer,
                    expires_in_secs: top.expires_in_secs,
                    reason: matches!(force, Layer::Automation(_))
                        .then(|| self.governor.reasons.get(&o.net).cloned())
                        .flatten(),
                    layers: if layers.len() > 1 { layers } else { Vec::new() },
                }
            })
            .collect()
    }
}

/// What `next` would take away at once from the running `current` file
/// policy, if it is too much for a reload to do unasked: more than half of
/// its overrides (two or more) lifted, or any token-bucket rate (the
/// default's or a class's, by name) cut more than 10x. `None`: nothing
/// of the kind.
#[must_use]
pub fn shrink(current: &Policy, next: &Policy) -> Option<String> {
    let mut why = Vec::new();
    let kept: HashSet<IpNet> = next.overrides.iter().map(|o| o.net).collect();
    let lifted: Vec<&Override> = current.overrides.iter().filter(|o| !kept.contains(&o.net)).collect();
    if lifted.len() >= 2 && lifted.len() * 2 > current.overrides.len() {
        let denies = lifted.iter().filter(|o| o.action == OverrideAction::Deny).count();
        why.push(format!(
            "it lifts {} of the {} overrides in force ({denies} of them denies)",
            lifted.len(),
            current.overrides.len()
        ));
    }
    let cut = |name: &str, was: &crate::policy::Limit, now: &crate::policy::Limit| {
        (was.window.is_none() && now.window.is_none() && now.rate.saturating_mul(10) < was.rate)
            .then(|| format!("it cuts the {name} rate from {} to {}", was.rate, now.rate))
    };
    why.extend(cut("default", &current.default, &next.default));
    for c in &current.classes {
        if let Some(n) = next.classes.iter().find(|n| n.name == c.name) {
            why.extend(cut(&format!("class {:?}", c.name), &c.limit, &n.limit));
        }
    }
    (!why.is_empty()).then(|| format!("the new policy is refused: {}", why.join("; ")))
}

/// A layer of decisions about a network, highest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// `limiter prefix ...` (the control socket).
    Operator,
    /// An `[[override]]` of the policy file.
    File,
    /// A penalty: the tenant layer's feedback or the daemon's escalation.
    Automation(SetBy),
}

impl Layer {
    /// How `prefix list` names it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Layer::Operator => SetBy::Operator.label(),
            Layer::File => "file",
            Layer::Automation(by) => by.label(),
        }
    }
}

impl LayerEntry {
    fn new(layer: Layer, action: Option<OverrideAction>, expires_in_secs: Option<u64>, in_force: bool) -> Self {
        let (action, rate, burst) = match action {
            Some(OverrideAction::Limit(l)) => ("limit", Some(l.rate), Some(l.burst)),
            Some(OverrideAction::Allow) => ("allow", None, None),
            Some(OverrideAction::Deny) => ("deny", None, None),
            None => ("unset", None, None),
        };
        LayerEntry { layer: layer.label().into(), action: action.into(), rate, burst, expires_in_secs, in_force }
    }
}

/// Seconds since the Unix epoch.
#[must_use]
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

mod bulk;
mod feedback;
#[cfg(test)]
mod layer_tests;
#[cfg(test)]
mod tests;
