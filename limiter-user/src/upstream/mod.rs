//! Rules announced to the transit over BGP for what the host's link
//! cannot absorb (`[upstream]`, docs/upstream.md). The daemon never
//! speaks BGP: a speaker the operator runs (ExaBGP) does, driven through
//! its command pipes by a thread of its own ([`speaker`]). The [`Book`]
//! holds the rules wanted, under the policy's rules: the operator's
//! outrank escalation's and link pressure's; nothing wider than the
//! policy's widths, past its cap, or touching a network it protects is
//! announced; a blackhole (which completes the attack for its victim)
//! only by the operator and only where the policy allows it.

pub mod exabgp;
pub mod rule;
pub mod series;
pub mod speaker;
mod state;
mod status;

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use self::rule::{Action, Key, Kind, Rule, Trigger};
use crate::policy::upstream::Upstream;

/// The longest a rule lives: a year (a TTL sent as a raw request may be
/// any number).
pub const MAX_TTL: u64 = 365 * 24 * 3600;

/// When a rule asked for at `now` for `ttl` seconds ends.
#[must_use]
pub fn expiry(now: u64, ttl: u64) -> u64 {
    now.saturating_add(ttl.min(MAX_TTL))
}

/// Why a rule is not announced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} is not allowed by the policy's [upstream] ({1})")]
    NotAllowed(&'static str, &'static str),
    #[error("{net} touches {protected}, which is never announced (upstream.never, or an allow)")]
    Protected { net: IpNet, protected: IpNet },
    #[error("{net} is wider than /{min} (upstream.min_v{v}_prefix)")]
    TooWide { net: IpNet, min: u8, v: u8 },
    #[error("{0} rules are announced already (upstream.max_rules)")]
    Cap(usize),
    #[error("{net} is announced by the {by} already, which outranks the {asked}")]
    Outranked { net: IpNet, by: &'static str, asked: &'static str },
}

impl Refusal {
    /// The reason's label in the metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::NotAllowed(..) => "not_allowed",
            Refusal::Protected { .. } => "protected",
            Refusal::TooWide { .. } => "too_wide",
            Refusal::Cap(_) => "cap",
            Refusal::Outranked { .. } => "outranked",
        }
    }
}

/// Link pressure as the last second found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pressure {
    /// Bits received in the last second.
    pub rx_bits_per_sec: u64,
    /// `link_capacity x pressure_percent`.
    pub threshold_bits_per_sec: u64,
    /// Pressure held for `pressure_sustained`: pressure rules are kept.
    pub pressured: bool,
    /// Unix time received bits/s went over the threshold (0: not over).
    pub over_since: u64,
}

/// The rules wanted, under the section's rules.
#[derive(Debug)]
pub struct Book {
    spec: Upstream,
    rules: BTreeMap<Key, Rule>,
    /// Sources no rule may touch: `never`, and every allowed network.
    protected: Vec<IpNet>,
    pub pressure: Pressure,
    /// Refusals by reason label.
    pub refused: BTreeMap<&'static str, u64>,
}

/// Whether two networks share an address.
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

impl Book {
    /// The book of `spec`, protecting `never` and `allowed` (the
    /// policy's and the operator's allows).
    #[must_use]
    pub fn new(spec: Upstream, allowed: Vec<IpNet>) -> Self {
        let protected = spec.never.iter().copied().chain(allowed).collect();
        Self { spec, rules: BTreeMap::new(), protected, pressure: Pressure::default(), refused: BTreeMap::new() }
    }

    #[must_use]
    pub fn spec(&self) -> &Upstream {
        &self.spec
    }

    /// The rules wanted now.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.values()
    }

    /// A new section and protected networks (`allowed`: the policy's and
    /// the operator's allows): rules they no longer permit are dropped,
    /// each named in the log.
    pub fn set(&mut self, spec: Upstream, allowed: Vec<IpNet>) {
        let rules = std::mem::take(&mut self.rules);
        let (pressure, refused) = (self.pressure, std::mem::take(&mut self.refused));
        *self = Self { pressure, refused, ..Self::new(spec, allowed) };
        for r in rules.into_values() {
            if let Err(e) = self.check(&r) {
                tracing::warn!(event = "upstream", "limiter: upstream {} no longer announced: {e}", r.describe());
            } else {
                self.rules.insert(r.key, r);
            }
        }
    }

    fn check(&self, r: &Rule) -> Result<(), Refusal> {
        let s = &self.spec;
        match r.key.kind {
            Kind::Flowspec if !s.flowspec => return Err(Refusal::NotAllowed("FlowSpec", "flowspec = false")),
            Kind::Blackhole if !s.rtbh => return Err(Refusal::NotAllowed("blackholing", "rtbh = false")),
            Kind::Blackhole if r.by != Trigger::Operator => {
                return Err(Refusal::NotAllowed("automatic blackholing", "the operator's command only"));
            }
            _ => {}
        }
        let (min, v) = match r.key.net {
            IpNet::V4(_) => (s.min_v4_prefix, 4),
            IpNet::V6(_) => (s.min_v6_prefix, 6),
        };
        if r.key.net.prefix_len() < min {
            return Err(Refusal::TooWide { net: r.key.net, min, v });
        }
        // A blackhole's network is the host's own destination, which
        // `never` lists: only a FlowSpec rule's source is checked.
        if r.key.kind == Kind::Flowspec
            && let Some(p) = self.protected.iter().find(|p| overlap(p, &r.key.net))
        {
            return Err(Refusal::Protected { net: r.key.net, protected: *p });
        }
        Ok(())
    }

    /// Want `rule`: `Ok(true)` if it changes what is wanted.
    pub fn add(&mut self, rule: Rule) -> Result<bool, Refusal> {
        let r = self.admit(rule);
        if let Err(e) = &r {
            *self.refused.entry(e.label()).or_default() += 1;
        }
        r
    }

    fn admit(&mut self, rule: Rule) -> Result<bool, Refusal> {
        self.check(&rule)?;
        match self.rules.get(&rule.key) {
            Some(old) if old.by > rule.by => {
                return Err(Refusal::Outranked { net: rule.key.net, by: old.by.name(), asked: rule.by.name() });
            }
            Some(old) if old.by == rule.by && old.action == rule.action => {
                // The same rule asked again: it lives on, never shorter.
                let expires = old.expires.max(rule.expires);
                let changed = expires != old.expires;
                if let Some(r) = self.rules.get_mut(&rule.key) {
                    r.expires = expires;
                }
                return Ok(changed);
            }
            None if self.rules.len() >= self.spec.max_rules => return Err(Refusal::Cap(self.spec.max_rules)),
            Some(_) | None => {}
        }
        self.rules.insert(rule.key, rule);
        Ok(true)
    }

    /// Withdraw the rules of `net` (all of them: `None`), whoever asked
    /// for them: how many.
    pub fn withdraw(&mut self, net: Option<IpNet>) -> usize {
        let before = self.rules.len();
        self.rules.retain(|k, _| net.is_some_and(|n| k.net != n.trunc()));
        before - self.rules.len()
    }

    /// Drop the rules whose time is up: whether any was.
    pub fn expire(&mut self, now: u64) -> bool {
        let before = self.rules.len();
        self.rules.retain(|_, r| {
            let keep = r.expires > now;
            if !keep {
                tracing::info!(event = "upstream", "limiter: upstream {} expired", r.describe());
            }
            keep
        });
        before != self.rules.len()
    }

    /// One second of link pressure: `rx_bits` received in it, and the
    /// prefixes the program drops most now with the rate (bytes a second)
    /// their class admits. Under pressure held for `pressure_sustained`,
    /// the top `pressure_prefixes` are wanted rate-limited to what the
    /// program admits of them, each until `hold_down` after it was last
    /// among them: whether what is wanted changed.
    pub fn second(&mut self, now: u64, rx_bits: u64, dropping: &[(IpNet, u64)]) -> bool {
        let s = &self.spec;
        if s.link_capacity == 0 {
            return false;
        }
        let threshold =
            u64::try_from(u128::from(s.link_capacity) * u128::from(s.pressure_percent) / 100).unwrap_or(u64::MAX);
        let p = &mut self.pressure;
        p.rx_bits_per_sec = rx_bits;
        p.threshold_bits_per_sec = threshold;
        if rx_bits >= threshold {
            if p.over_since == 0 {
                p.over_since = now;
                tracing::info!(
                    event = "upstream",
                    "limiter: link pressure: {rx_bits} bits/s received, over {threshold}"
                );
            }
            if !p.pressured && now.saturating_sub(p.over_since) >= s.pressure_sustained.as_secs() {
                p.pressured = true;
                tracing::warn!(
                    event = "upstream",
                    "limiter: link pressure sustained: announcing the top dropping prefixes upstream"
                );
            }
        } else {
            if p.pressured {
                tracing::info!(
                    event = "upstream",
                    "limiter: link pressure ended: pressure rules withdrawn after the hold-down"
                );
            }
            p.over_since = 0;
            p.pressured = false;
        }
        if !p.pressured {
            return false;
        }
        let (top, hold) = (s.pressure_prefixes, s.hold_down.as_secs().max(1));
        let mut changed = false;
        for (net, bytes) in dropping.iter().take(top) {
            let rule = Rule {
                key: Key::flow(*net),
                action: Action::RateLimit { bytes_per_sec: *bytes },
                by: Trigger::Pressure,
                since: now,
                expires: expiry(now, hold),
            };
            match self.add(rule) {
                Ok(c) => changed |= c,
                Err(e @ (Refusal::Protected { .. } | Refusal::TooWide { .. } | Refusal::Cap(_))) => {
                    tracing::debug!("limiter: link pressure: {net} not announced: {e}");
                }
                Err(_) => {}
            }
        }
        changed
    }

    /// The rules wanted, by trigger.
    #[must_use]
    pub fn by_trigger(&self) -> [(Trigger, usize); 3] {
        let n = |t| self.rules.values().filter(|r| r.by == t).count();
        [Trigger::Operator, Trigger::Escalation, Trigger::Pressure].map(|t| (t, n(t)))
    }
}

/// `limiter upstream list`, `limiter status`'s upstream part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamInfo {
    /// The speaker's pipes (`PATH.in`, `PATH.out`).
    pub speaker: String,
    pub shadow: bool,
    pub max_rules: usize,
    pub status: speaker::Status,
    pub rules: Vec<Rule>,
    pub pressure: Pressure,
}

#[cfg(test)]
mod tests;
