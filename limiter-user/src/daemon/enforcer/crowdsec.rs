//! CrowdSec's decisions in the deny set: each origin (`crowdsec:cscli`,
//! `crowdsec:lists:NAME`, ...) denies what its decisions name, exactly
//! (an address is itself, not its /24), until each decision's duration
//! ends or the LAPI deletes it; a deleted decision lifts only what it
//! applied (another decision, or a feed, may still deny the network).
//! `startup` pulls replace the whole picture; the others are deltas.

use std::collections::{BTreeSet, HashMap, HashSet};

use ipnet::IpNet;

use super::{ApplyError, Enforcer};
use crate::clock::unix_now;
use crate::{
    crowdsec::{Decision, Pulled},
    dataplane::{PolicyMaps, deny::Origin},
    policy::crowdsec::Crowdsec,
};

/// Origin indexes CrowdSec's decisions may take, the shared one with
/// them (of the set's 64).
pub const CROWDSEC_ORIGINS: usize = 16;

/// IPv6 prefix lengths CrowdSec's decisions may bring into use (of the
/// set's `MAX_LENS`): the rest are kept for feeds and escalation (ranges
/// of 60 lengths from the LAPI took all 40 on 394d35c, and the operator's
/// feed with a /64 and a /48 was refused). Decisions of lengths in use
/// (by anyone) always fit.
pub const CROWDSEC_V6_LENS: usize = limiter_common::deny::MAX_LENS - 16;

/// The origin CrowdSec's sources share past [`CROWDSEC_ORIGINS`].
const SHARED: &str = "crowdsec:other";

/// The decisions in force, by network and origin.
#[derive(Debug, Default)]
pub struct Decisions {
    /// Each (network, origin)'s decisions: id and when it ends (Unix s).
    by_net: HashMap<(IpNet, Origin), Vec<(i64, u64)>>,
    /// When each ends, for expiry.
    ends: BTreeSet<(u64, i64, IpNet, Origin)>,
    /// Decisions left out since the start: the cap, too wide, filtered.
    pub left_out: u64,
    /// Networks held in shadow (counted, not enforced).
    pub shadow: usize,
    /// IPv4 addresses the networks in force cover together (a network
    /// two origins deny counts twice: an upper bound).
    pub v4_addresses: u64,
    /// What the parts of the pull being applied did so far.
    tally: Tally,
    /// During a startup pull: the networks denied for CrowdSec before it
    /// (the decisions it replaces, and the pins' at a restart) that none
    /// of its parts named yet; its last part lifts what is left. Kept
    /// apart so that no part walks the whole set.
    stale: HashMap<(IpNet, Origin), Vec<(i64, u64)>>,
}

/// A pull's counts over its parts.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    new: usize,
    deleted: usize,
    added: usize,
    lifted: usize,
    left_out: u64,
    shadow: usize,
}

/// IPv4 addresses `net` covers (0 for IPv6).
fn v4_addresses(net: &IpNet) -> u64 {
    match net {
        IpNet::V4(n) => 1u64 << (32 - u32::from(n.prefix_len())),
        IpNet::V6(_) => 0,
    }
}

impl Decisions {
    /// Networks denied for CrowdSec (each origin's count).
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_net.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_net.is_empty()
    }

    /// When the next decision ends.
    #[must_use]
    pub fn next_end(&self) -> Option<u64> {
        self.ends.first().map(|e| e.0)
    }

    fn insert(&mut self, net: IpNet, origin: Origin, id: i64, end: u64) {
        if !self.by_net.contains_key(&(net, origin)) {
            self.v4_addresses += v4_addresses(&net);
        }
        let ids = self.by_net.entry((net, origin)).or_default();
        if let Some(old) = ids.iter_mut().find(|(i, _)| *i == id) {
            self.ends.remove(&(old.1, id, net, origin));
            old.1 = end;
        } else {
            ids.push((id, end));
        }
        self.ends.insert((end, id, net, origin));
    }

    /// Forget decision `id`; whether its (network, origin) has none left.
    fn remove(&mut self, net: IpNet, origin: Origin, id: i64) -> bool {
        let Some(ids) = self.by_net.get_mut(&(net, origin)) else { return false };
        if let Some(at) = ids.iter().position(|(i, _)| *i == id) {
            let (_, end) = ids.swap_remove(at);
            self.ends.remove(&(end, id, net, origin));
        }
        if ids.is_empty() {
            self.by_net.remove(&(net, origin));
            self.v4_addresses -= v4_addresses(&net);
            return true;
        }
        false
    }
}

impl Enforcer {
    /// Take a pull of the decision stream (or a part of one: see
    /// [`crate::crowdsec::Part`]) under `spec`. A `startup` pull is the
    /// whole picture: its first part starts the decisions over (the deny
    /// set keeps every network meanwhile: no gap), and its last lifts
    /// what no decision of it names, pinned ones included (decisions
    /// deleted while no daemon ran). The others are deltas. The line
    /// comes with the last part.
    pub fn crowdsec(
        &mut self,
        maps: &mut impl PolicyMaps,
        spec: &Crowdsec,
        pulled: Pulled,
    ) -> Result<String, ApplyError> {
        let now = unix_now();
        let Pulled { startup, pull, part, .. } = pulled;
        // The LAPI's own address is never denied: a decision covering it
        // would cut the daemon off the deletions that lift it.
        let lapi = lapi_address(&spec.lapi_url);
        // Special-purpose space (private, loopback, this network,
        // broadcast...) is left out unless the section allows it, as a
        // feed's is: the LAPI's 256 /8s denied all of IPv4 with them.
        let taken = |d: &Decision| {
            !crate::policy::feed::wider_than(&d.net, spec.min_v4_prefix, spec.min_v6_prefix)
                && spec.takes(d.kind(), d.origin(), d.scenario())
                && lapi.is_none_or(|a| !d.net.contains(&a))
                && (spec.allow_bogons || crate::feeds::bogons::bogon_overlap(&d.net).is_none())
        };
        if part.first {
            self.begin_pull(spec, startup, part.of);
        }
        // Decisions unreadable (value or duration) are left out, and counted.
        let unreadable = pull.bad_value + pull.bad_duration;
        let (mut added, mut lifted, mut left_out) = (0usize, 0usize, unreadable as u64);
        if !startup {
            // A deletion names no new origin: it looks in the decision's
            // own and in the shared one.
            for d in &pull.deleted {
                let named = [d.source(), SHARED.to_owned()].map(|n| self.deny.set.named(&n));
                for origin in named.into_iter().flatten() {
                    if self.crowdsec.remove(d.net, origin, d.id) {
                        self.deny.set.remove(origin, &d.net);
                        lifted += 1;
                    }
                }
            }
        }
        let mut shadow: HashSet<IpNet> = HashSet::new();
        // The origin of the last decision's names (decisions of a pull
        // share them): looked up once per run of them, not per decision.
        let mut last: Option<(std::sync::Arc<crate::crowdsec::Names>, Origin)> = None;
        for d in pull.new.iter().filter(|d| !d.ttl.is_zero()) {
            if !taken(d) {
                left_out += 1;
                continue;
            }
            if spec.shadow {
                shadow.insert(d.net);
                continue;
            }
            let origin = match &last {
                Some((names, origin)) if std::sync::Arc::ptr_eq(names, &d.names) => *origin,
                _ => {
                    let Ok(origin) = self.crowdsec_origin(&d.source()) else {
                        left_out += 1;
                        continue;
                    };
                    last = Some((std::sync::Arc::clone(&d.names), origin));
                    origin
                }
            };
            let known = self.crowdsec.by_net.contains_key(&(d.net, origin));
            // The cap on networks, and on the IPv4 space they cover.
            let covered = self.crowdsec.v4_addresses + v4_addresses(&d.net);
            if !known && (self.crowdsec.len() >= spec.max_decisions || covered > spec.max_v4_addresses) {
                left_out += 1;
                continue;
            }
            // Denied already before this startup pull (by the decisions it
            // replaces, or the pins): kept, not added again, not lifted.
            let held = startup && self.crowdsec.stale.remove(&(d.net, origin)).is_some();
            if !known && !held && self.deny.set.add_within(origin, &d.net, CROWDSEC_V6_LENS).is_err() {
                left_out += 1;
                continue;
            }
            added += usize::from(!known && !held);
            self.crowdsec.insert(d.net, origin, d.id, now.saturating_add(d.ttl.as_secs()));
        }
        if startup && part.last {
            lifted += self.sweep_crowdsec();
        }
        let t = &mut self.crowdsec.tally;
        (t.new, t.deleted, t.added, t.lifted) =
            (t.new + pull.new.len(), t.deleted + pull.deleted.len(), t.added + added, t.lifted + lifted);
        t.left_out += left_out;
        t.shadow += shadow.len();
        self.crowdsec.left_out += left_out;
        if part.last && (startup || spec.shadow) {
            self.crowdsec.shadow = self.crowdsec.tally.shadow;
        }
        self.write_set(maps)?;
        let t = self.crowdsec.tally;
        if !part.last || (!startup && t.new == 0 && t.deleted == 0 && unreadable == 0) {
            // A part, or nothing changed: no line (a pull comes every few seconds).
            return Ok(String::new());
        }
        let unreadable = (unreadable > 0).then_some((pull.bad_value, pull.bad_duration));
        Ok(self.pull_line(startup, spec.shadow, unreadable))
    }

    /// Lift the decisions whose time is up at `now`.
    pub fn expire_crowdsec(&mut self, maps: &mut impl PolicyMaps, now: u64) -> Option<Result<String, ApplyError>> {
        let due: Vec<(u64, i64, IpNet, Origin)> =
            self.crowdsec.ends.iter().take_while(|e| e.0 <= now).copied().collect();
        if due.is_empty() {
            return None;
        }
        let mut lifted = 0;
        for (_, id, net, origin) in &due {
            if self.crowdsec.remove(*net, *origin, *id) {
                self.deny.set.remove(*origin, net);
                lifted += 1;
            }
        }
        Some(
            self.write_set(maps)
                .map(|()| format!("crowdsec: {} decision(s) ended, {lifted} network(s) lifted", due.len())),
        )
    }

    /// Lift every CrowdSec decision (the section is gone).
    pub(super) fn lift_crowdsec(&mut self, maps: &mut impl PolicyMaps) -> Result<(), crate::dataplane::LoadError> {
        let names: Vec<String> = self.deny.set.names().iter().filter(|n| n.starts_with("crowdsec:")).cloned().collect();
        if names.is_empty() && self.crowdsec.is_empty() {
            return Ok(());
        }
        for name in names {
            if let Ok(o) = self.deny.set.origin(&name) {
                let _ = self.deny.set.replace(o, &HashSet::new());
            }
        }
        self.crowdsec = Decisions { left_out: self.crowdsec.left_out, ..Decisions::default() };
        let ch = self.deny.set.finish();
        maps.set_deny_origins(self.deny.set.names())?;
        maps.write_deny(&ch)
    }

    /// CrowdSec's decisions.
    #[must_use]
    pub fn crowdsec_decisions(&self) -> &Decisions {
        &self.crowdsec
    }

    /// The first `limit` networks CrowdSec's decisions deny, by network,
    /// as `prefix list` shows them (origin, time left), and how many more.
    #[must_use]
    pub fn crowdsec_entries(&self, limit: usize) -> (Vec<crate::control::PrefixEntry>, usize) {
        use crate::control::{EntryAction, Origin as Shown, PrefixEntry};
        let now = unix_now();
        let mut keys: Vec<&(IpNet, Origin)> = self.crowdsec.by_net.keys().collect();
        keys.sort_unstable_by_key(|(net, o)| (*net, o.0));
        let names = self.deny.set.names();
        let entries = keys
            .iter()
            .take(limit)
            .map(|&&(net, origin)| {
                let end = self.crowdsec.by_net[&(net, origin)].iter().map(|(_, e)| *e).max().unwrap_or(now);
                PrefixEntry {
                    cidr: net,
                    action: EntryAction::Deny,
                    rate: None,
                    burst: None,
                    origin: Shown::Crowdsec,
                    expires_in_secs: Some(end.saturating_sub(now)),
                    reason: None,
                    layers: Vec::new(),
                    source: names.get(usize::from(origin.0)).cloned(),
                }
            })
            .collect();
        (entries, keys.len().saturating_sub(limit))
    }

    /// The origin of CrowdSec's `source`: its own while CrowdSec names
    /// fewer than [`CROWDSEC_ORIGINS`], else the one they share (80 list
    /// scenarios took all 64 indexes on 394d35c, and the operator's next
    /// feed was refused): feeds always keep room.
    fn crowdsec_origin(&mut self, source: &str) -> Result<Origin, crate::dataplane::deny::DenyError> {
        if let Some(o) = self.deny.set.named(source) {
            return Ok(o);
        }
        let named = self.deny.set.names().iter().filter(|n| n.starts_with("crowdsec:") && *n != SHARED).count();
        self.deny.set.origin(if named + 1 < CROWDSEC_ORIGINS { source } else { SHARED })
    }

    fn write_set(&mut self, maps: &mut impl PolicyMaps) -> Result<(), ApplyError> {
        let ch = self.deny.set.finish();
        let written = maps.set_deny_origins(self.deny.set.names()).and_then(|()| maps.write_deny(&ch));
        if let Err(e) = written {
            let _ = self.restore_deny(maps);
            return Err(e.into());
        }
        Ok(())
    }
}

/// The LAPI's address, when its URL names one (not a host name).
fn lapi_address(url: &str) -> Option<std::net::IpAddr> {
    let (authority, _) = crate::policy::crowdsec::lapi_parts(url)?;
    let (host, _) = authority.rsplit_once(':')?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

mod pull;
#[cfg(test)]
mod tests;
