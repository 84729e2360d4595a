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
pub mod feature;
pub mod rule;
pub mod series;
pub mod speaker;
mod state;

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use self::rule::{Action, Key, Kind, Rule, by_word};
use crate::{origin::Origin, policy::upstream::Upstream};

/// The longest a rule lives: a year (a TTL sent as a raw request may be
/// any number).
pub const MAX_TTL: u64 = 365 * 24 * 3600;
/// The highest FlowSpec rate ExaBGP sends (it clips a higher one to
/// this, in bytes a second): a higher one is refused, never listed as
/// something the transit was not told.
pub const MAX_RATE: u64 = 1_000_000_000_000;

/// When a rule asked for now for `ttl` seconds ends, in whole Unix
/// seconds: the second after now's fraction, so that a rule whose end
/// is checked against whole seconds never ends before its `ttl`.
#[must_use]
pub fn expiry_from_now(ttl: u64) -> u64 {
    let now = crate::clock::since_epoch();
    let ceil = now.as_secs() + u64::from(now.subsec_nanos() > 0);
    expiry(ceil, ttl)
}

/// When a rule asked for at `now` for `ttl` seconds ends.
#[must_use]
pub fn expiry(now: u64, ttl: u64) -> u64 {
    now.saturating_add(ttl.min(MAX_TTL))
}

/// How many of `max_rules` link pressure may hold: three quarters. The
/// rest is kept for escalations and the operator, whom pressure rules
/// never crowd out.
#[must_use]
pub fn pressure_cap(max_rules: usize) -> usize {
    max_rules - max_rules.div_ceil(4)
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
    #[error(
        "{wanted} rules are wanted already, the most upstream.max_rules allows ({operator} the operator's, {escalation} escalation's, {pressure} link pressure's; {announced} announced, {pending} pending)"
    )]
    Cap { wanted: usize, operator: usize, escalation: usize, pressure: usize, announced: usize, pending: usize },
    #[error(
        "link pressure holds {0} rules already, its share of upstream.max_rules (the rest is kept for escalations and the operator)"
    )]
    PressureCap(usize),
    #[error("the destination {dest} is not of the source {net}'s address family")]
    Family { net: IpNet, dest: IpNet },
    #[error("a rate of {0} bytes/s is over {MAX_RATE}, the most a FlowSpec rule carries")]
    Rate(u64),
    #[error("{net} is announced by the {by} already, which outranks the {asked}")]
    Outranked { net: IpNet, by: &'static str, asked: &'static str },
}

impl Refusal {
    /// The reason's label in the metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::NotAllowed(..) | Refusal::Family { .. } | Refusal::Rate(_) => "not_allowed",
            Refusal::Protected { .. } => "protected",
            Refusal::TooWide { .. } => "too_wide",
            Refusal::Cap { .. } | Refusal::PressureCap(_) => "cap",
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
    /// What the speaker last said it holds and has pending (a refusal at
    /// the cap states them).
    pub sent: (usize, usize),
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
        Self {
            spec,
            rules: BTreeMap::new(),
            protected,
            pressure: Pressure::default(),
            refused: BTreeMap::new(),
            sent: (0, 0),
        }
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
        let (pressure, refused, sent) = (self.pressure, std::mem::take(&mut self.refused), self.sent);
        *self = Self { pressure, refused, sent, ..Self::new(spec, allowed) };
        // The operator's first: a smaller cap keeps theirs.
        let mut rules: Vec<Rule> = rules.into_values().collect();
        rules.sort_by_key(|r| r.by);
        for r in rules {
            let what = r.describe();
            if let Err(e) = self.admit(r) {
                tracing::warn!(event = "upstream", "limiter: upstream {what} no longer announced: {e}");
            }
        }
    }

    fn check(&self, r: &Rule) -> Result<(), Refusal> {
        let s = &self.spec;
        match r.key.kind {
            Kind::Flowspec if !s.flowspec => return Err(Refusal::NotAllowed("FlowSpec", "flowspec = false")),
            Kind::Blackhole if !s.rtbh => return Err(Refusal::NotAllowed("blackholing", "rtbh = false")),
            Kind::Blackhole if r.by != Origin::Operator => {
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
        if let Some(dest) = r.key.dest
            && dest.addr().is_ipv4() != r.key.net.addr().is_ipv4()
        {
            return Err(Refusal::Family { net: r.key.net, dest });
        }
        if let Action::RateLimit { bytes_per_sec } = r.action
            && bytes_per_sec > MAX_RATE
        {
            return Err(Refusal::Rate(bytes_per_sec));
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

    /// Whether [`Book::add`] would take `rule` now, changing nothing.
    pub fn admits(&self, rule: &Rule) -> Result<(), Refusal> {
        self.check(rule)?;
        match self.rules.get(&rule.key) {
            Some(old) if old.by.outranks(rule.by) => {
                Err(Refusal::Outranked { net: rule.key.net, by: by_word(old.by), asked: by_word(rule.by) })
            }
            None if rule.by == Origin::Pressure
                && self.rules.values().filter(|r| r.by == Origin::Pressure).count()
                    >= pressure_cap(self.spec.max_rules) =>
            {
                Err(Refusal::PressureCap(pressure_cap(self.spec.max_rules)))
            }
            None if self.rules.len() >= self.spec.max_rules && !self.rules.values().any(|r| rule.by.outranks(r.by)) => {
                let [(_, operator), (_, escalation), (_, pressure)] = self.by_trigger();
                let (announced, pending) = self.sent;
                Err(Refusal::Cap { wanted: self.rules.len(), operator, escalation, pressure, announced, pending })
            }
            // Its own key again, or room.
            Some(_) | None => Ok(()),
        }
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
            Some(old) if old.by.outranks(rule.by) => {
                return Err(Refusal::Outranked { net: rule.key.net, by: by_word(old.by), asked: by_word(rule.by) });
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
            Some(_) => {}
            None => self.room_for(rule.by)?,
        }
        self.rules.insert(rule.key.clone(), rule);
        Ok(true)
    }

    /// Room for one more rule of `by`: link pressure within its share
    /// ([`pressure_cap`]); at `max_rules`, a rule of a lower trigger is
    /// let go for a higher one's (the lowest first, then the one that
    /// ends first), so the operator always has room unless the operator's
    /// own rules fill the cap.
    fn room_for(&mut self, by: Origin) -> Result<(), Refusal> {
        let max = self.spec.max_rules;
        if by == Origin::Pressure {
            let held = self.rules.values().filter(|r| r.by == Origin::Pressure).count();
            if held >= pressure_cap(max) {
                return Err(Refusal::PressureCap(held));
            }
        }
        if self.rules.len() < max {
            return Ok(());
        }
        let lowest = self
            .rules
            .values()
            .filter(|r| by.outranks(r.by))
            .min_by_key(|r| (std::cmp::Reverse(r.by), r.expires))
            .map(|r| r.key.clone());
        let Some(key) = lowest else {
            let [(_, operator), (_, escalation), (_, pressure)] = self.by_trigger();
            let (announced, pending) = self.sent;
            return Err(Refusal::Cap { wanted: self.rules.len(), operator, escalation, pressure, announced, pending });
        };
        if let Some(r) = self.rules.remove(&key) {
            tracing::warn!(
                event = "upstream",
                "limiter: upstream {} let go at upstream.max_rules ({max}) for a rule of the {}",
                r.describe(),
                by_word(by)
            );
        }
        Ok(())
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
    /// rules that match what the program drops most now (each prefix's
    /// source, with its class's protocol and ports and this host's
    /// address) with the rate (bytes a second) the prefix is allowed in
    /// all. Under pressure held for `pressure_sustained`, the top
    /// `pressure_prefixes` are wanted rate-limited to it, each until
    /// `hold_down` after it was last among them: whether what is wanted
    /// changed.
    pub fn second(&mut self, now: u64, rx_bits: u64, dropping: &[(Key, u64)]) -> bool {
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
        for (key, bytes) in dropping.iter().take(top) {
            let net = key.net;
            let rule = Rule {
                key: key.clone(),
                action: Action::RateLimit { bytes_per_sec: *bytes },
                by: Origin::Pressure,
                since: now,
                expires: expiry(now, hold),
            };
            match self.add(rule) {
                Ok(c) => changed |= c,
                Err(
                    e @ (Refusal::Protected { .. }
                    | Refusal::TooWide { .. }
                    | Refusal::Cap { .. }
                    | Refusal::PressureCap(_)),
                ) => {
                    tracing::debug!("limiter: link pressure: {net} not announced: {e}");
                }
                Err(_) => {}
            }
        }
        changed
    }

    /// The rules wanted, by trigger.
    #[must_use]
    pub fn by_trigger(&self) -> [(Origin, usize); 3] {
        let n = |t| self.rules.values().filter(|r| r.by == t).count();
        [Origin::Operator, Origin::Escalation, Origin::Pressure].map(|t| (t, n(t)))
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
