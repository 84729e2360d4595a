//! CrowdSec's decisions in the deny set: each origin (`crowdsec:cscli`,
//! `crowdsec:lists:NAME`, ...) denies what its decisions name, exactly
//! (an address is itself, not its /24), until each decision's duration
//! ends or the LAPI deletes it; a deleted decision lifts only what it
//! applied (another decision, or a feed, may still deny the network).
//! `startup` pulls replace the whole picture; the others are deltas.

use std::collections::{BTreeSet, HashMap, HashSet};

use ipnet::IpNet;

use super::DenySource;
use crate::{
    clock::unix_now,
    control::PrefixEntry,
    crowdsec::{Decision, Pulled},
    dataplane::deny::{DenyError, DenySet, OriginId},
    origin::{Named, Origin},
    policy::{Policy, crowdsec::Crowdsec},
};

/// Origin indexes CrowdSec's decisions may take, the shared one with
/// them (of the set's 64).
pub const CROWDSEC_ORIGINS: usize = 16;

/// IPv6 prefix lengths CrowdSec's decisions may bring into use (of the
/// set's `MAX_LENS`): the rest are kept for feeds and escalation (ranges
/// of 60 lengths from the LAPI would take all 40, and the operator's feed
/// with a /64 and a /48 would be refused). Decisions of lengths in use
/// (by anyone) always fit.
pub const CROWDSEC_V6_LENS: usize = limiter_common::deny::MAX_LENS - 16;

/// The origin CrowdSec's sources share past [`CROWDSEC_ORIGINS`].
const SHARED: &str = "crowdsec:other";

/// The decisions in force, by network and origin.
#[derive(Debug, Default)]
pub struct Decisions {
    /// Each (network, origin)'s decisions: id and when it ends (Unix s).
    by_net: HashMap<(IpNet, OriginId), Vec<(i64, u64)>>,
    /// When each ends, for expiry.
    ends: BTreeSet<(u64, i64, IpNet, OriginId)>,
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
    stale: HashMap<(IpNet, OriginId), Vec<(i64, u64)>>,
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

    fn insert(&mut self, net: IpNet, origin: OriginId, id: i64, end: u64) {
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
    fn remove(&mut self, net: IpNet, origin: OriginId, id: i64) -> bool {
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

    /// Take a pull of the decision stream (or a part of one: see
    /// [`crate::crowdsec::Part`]) under `spec` into `set`. A `startup`
    /// pull is the whole picture: its first part starts the decisions
    /// over (the deny set keeps every network meanwhile: no gap), and its
    /// last lifts what no decision of it names, pinned ones included
    /// (decisions deleted while no daemon ran). The others are deltas.
    /// The line comes with the last part (empty for the others).
    pub(super) fn take(&mut self, set: &mut DenySet, spec: &Crowdsec, pulled: Pulled) -> String {
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
                && (spec.allow_bogons || crate::nets::bogons::bogon_overlap(&d.net).is_none())
        };
        if part.first {
            self.begin_pull(set, spec, startup, part.of);
        }
        // Decisions unreadable (value or duration) are left out, and counted.
        let unreadable = pull.bad_value + pull.bad_duration;
        let (mut added, mut lifted, mut left_out) = (0usize, 0usize, unreadable as u64);
        if !startup {
            // A deletion names no new origin: it looks in the decision's
            // own and in the shared one.
            for d in &pull.deleted {
                let named = [d.source(), SHARED.to_owned()].map(|n| set.named(&n));
                for origin in named.into_iter().flatten() {
                    if self.remove(d.net, origin, d.id) {
                        set.remove(origin, &d.net);
                        lifted += 1;
                    }
                }
            }
        }
        let mut shadow: HashSet<IpNet> = HashSet::new();
        // The origin of the last decision's names (decisions of a pull
        // share them): looked up once per run of them, not per decision.
        let mut last: Option<(std::sync::Arc<crate::crowdsec::Names>, OriginId)> = None;
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
                    let Ok(origin) = origin_of(set, &d.source()) else {
                        left_out += 1;
                        continue;
                    };
                    last = Some((std::sync::Arc::clone(&d.names), origin));
                    origin
                }
            };
            let known = self.by_net.contains_key(&(d.net, origin));
            // The cap on networks, and on the IPv4 space they cover.
            let covered = self.v4_addresses + v4_addresses(&d.net);
            if !known && (self.len() >= spec.max_decisions || covered > spec.max_v4_addresses) {
                left_out += 1;
                continue;
            }
            // Denied already before this startup pull (by the decisions it
            // replaces, or the pins): kept, not added again, not lifted.
            let held = startup && self.stale.remove(&(d.net, origin)).is_some();
            if !known && !held && set.add_within(origin, &d.net, CROWDSEC_V6_LENS).is_err() {
                left_out += 1;
                continue;
            }
            added += usize::from(!known && !held);
            self.insert(d.net, origin, d.id, now.saturating_add(d.ttl.as_secs()));
        }
        if startup && part.last {
            lifted += self.sweep(set);
        }
        let t = &mut self.tally;
        (t.new, t.deleted, t.added, t.lifted) =
            (t.new + pull.new.len(), t.deleted + pull.deleted.len(), t.added + added, t.lifted + lifted);
        t.left_out += left_out;
        t.shadow += shadow.len();
        self.left_out += left_out;
        if part.last && (startup || spec.shadow) {
            self.shadow = self.tally.shadow;
        }
        let t = self.tally;
        if !part.last || (!startup && t.new == 0 && t.deleted == 0 && unreadable == 0) {
            // A part, or nothing changed: no line (a pull comes every few seconds).
            return String::new();
        }
        let unreadable = (unreadable > 0).then_some((pull.bad_value, pull.bad_duration));
        self.pull_line(startup, spec.shadow, unreadable)
    }

    /// The line of a pull, when its last part is applied.
    fn pull_line(&self, startup: bool, shadow: bool, unreadable: Option<(usize, usize)>) -> String {
        let t = self.tally;
        format!(
            "crowdsec: {} pull: {} new, {} deleted{}; {} networks denied, {} lifted, {} left out; {} in force{}",
            if startup { "startup" } else { "delta" },
            t.new,
            t.deleted,
            unreadable.map_or_else(String::new, |(value, duration)| format!(
                ", {value} with an unreadable value, {duration} with an unreadable or sub-second duration"
            )),
            t.added,
            t.lifted,
            t.left_out,
            self.len(),
            if shadow { format!(" (shadow: {} counted, not enforced)", self.shadow) } else { String::new() }
        )
    }

    /// The first part of a pull: its tally starts; a startup pull starts
    /// the decisions over (what they denied set aside, to be lifted at
    /// its end unless it names them again) with room for all of it.
    fn begin_pull(&mut self, set: &mut DenySet, spec: &Crowdsec, startup: bool, of: usize) {
        self.tally = Tally::default();
        if !startup {
            return;
        }
        let old = std::mem::take(self);
        let mut stale = old.stale;
        if stale.is_empty() {
            stale = old.by_net;
        } else {
            stale.extend(old.by_net);
        }
        *self = Decisions { left_out: old.left_out, stale, ..Decisions::default() };
        // A map growing by doubling rehashes it all within one part; a
        // delta's new networks are few.
        let room = of.min(spec.max_decisions);
        self.by_net.reserve(room);
        set.reserve(room);
    }

    /// The end of a startup pull: lift every network denied for CrowdSec
    /// before it that none of its decisions named. Returns how many.
    fn sweep(&mut self, set: &mut DenySet) -> usize {
        let mut lifted = 0;
        for (net, origin) in std::mem::take(&mut self.stale).into_keys() {
            if !self.by_net.contains_key(&(net, origin)) {
                set.remove(origin, &net);
                lifted += 1;
            }
        }
        lifted
    }
}

impl DenySource for Decisions {
    /// Every decision is lifted when the policy has no `[crowdsec]`.
    fn follow(&mut self, set: &mut DenySet, policy: &Policy) {
        if policy.crowdsec.is_some() {
            return;
        }
        let names: Vec<String> = set.names().iter().filter(|n| is_crowdsec(n)).cloned().collect();
        for name in names {
            if let Ok(o) = set.origin(&name) {
                let _ = set.replace(o, &HashSet::new());
            }
        }
        *self = Decisions { left_out: self.left_out, ..Decisions::default() };
    }

    /// Lift the decisions whose time is up at `now`.
    fn expire(&mut self, set: &mut DenySet, now: u64) -> Option<String> {
        let due: Vec<(u64, i64, IpNet, OriginId)> = self.ends.iter().take_while(|e| e.0 <= now).copied().collect();
        if due.is_empty() {
            return None;
        }
        let mut lifted = 0;
        for (_, id, net, origin) in &due {
            if self.remove(*net, *origin, *id) {
                set.remove(*origin, net);
                lifted += 1;
            }
        }
        Some(format!("crowdsec: {} decision(s) ended, {lifted} network(s) lifted", due.len()))
    }

    fn next_end(&self) -> Option<u64> {
        self.ends.first().map(|e| e.0)
    }

    /// The first `limit` networks the decisions deny, by network, with
    /// their origin and time left.
    fn entries(&self, set: &DenySet, limit: usize) -> (Vec<PrefixEntry>, usize) {
        use crate::{control::Shown, policy::Action};
        let now = unix_now();
        let mut keys: Vec<&(IpNet, OriginId)> = self.by_net.keys().collect();
        keys.sort_unstable_by_key(|(net, o)| (*net, o.0));
        let names = set.names();
        let entries = keys
            .iter()
            .take(limit)
            .map(|&&(net, origin)| {
                let end = self.by_net[&(net, origin)].iter().map(|(_, e)| *e).max().unwrap_or(now);
                PrefixEntry {
                    cidr: net,
                    action: Action::Deny,
                    rate: None,
                    burst: None,
                    origin: Shown::of(crate::origin::Origin::Crowdsec),
                    expires_in_secs: Some(end.saturating_sub(now)),
                    reason: None,
                    layers: Vec::new(),
                    source: names.get(usize::from(origin.0)).cloned(),
                }
            })
            .collect();
        (entries, keys.len().saturating_sub(limit))
    }

    /// The networks the pins hold for CrowdSec, lifted by the first
    /// startup pull unless it names them (decisions deleted while no
    /// daemon ran).
    fn restored(&mut self, set: &DenySet) {
        let origins: Vec<OriginId> =
            (0u16..).zip(set.names()).filter(|(_, n)| is_crowdsec(n)).map(|(i, _)| OriginId(i)).collect();
        for origin in origins {
            self.stale.extend(set.of(origin).map(|n| ((n, origin), Vec::new())));
        }
    }
}

/// Whether the set's origin `name` is one of CrowdSec's.
fn is_crowdsec(name: &str) -> bool {
    Named::name_in(name, Origin::Crowdsec).is_some()
}

/// The origin of CrowdSec's `source`: its own while CrowdSec names fewer
/// than [`CROWDSEC_ORIGINS`], else the one they share (80 list scenarios
/// would take all 64 indexes, and the operator's next feed would be
/// refused): feeds always keep room.
fn origin_of(set: &mut DenySet, source: &str) -> Result<OriginId, DenyError> {
    if let Some(o) = set.named(source) {
        return Ok(o);
    }
    let named = set.names().iter().filter(|n| is_crowdsec(n) && *n != SHARED).count();
    set.origin(if named + 1 < CROWDSEC_ORIGINS { source } else { SHARED })
}

/// The LAPI's address, when its URL names one (not a host name).
fn lapi_address(url: &str) -> Option<std::net::IpAddr> {
    let (authority, _) = crate::policy::crowdsec::lapi_parts(url)?;
    let (host, _) = authority.rsplit_once(':')?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

#[cfg(test)]
mod tests;
