//! Attacks as records: an attack begins when the guard refuses (drops,
//! would drop in shadow, answers with a SYN cookie) more than
//! `[attacks]`'s `drops_per_sec` or `bits_per_sec` for `sustain`, and ends
//! once it has refused less than both for `quiet`. Its record
//! ([`Attack`]) keeps when, how big, what was refused and why, which
//! classes and source prefixes (from the sampled drops), and what the
//! guard did meanwhile (every change of its policy state, whoever made
//! it, and announcements upstream). The detector here is fed one second
//! at a time and says when one starts, grows, and ends; the feature
//! (`feature.rs`) logs it, keeps it in a file, tells the webhooks
//! (`webhook.rs`) and answers `limiter attacks`.

pub mod feature;
pub mod pcap;
pub mod webhook;

use std::collections::{HashMap, HashSet};

use limiter_common::{BucketKey, REASON_COUNT, Reason};

use crate::control::{Amount, Attack, AttackAction, Conforming, Share};
use crate::dataplane::Totals;
use crate::policy::attacks::Attacks as Settings;

/// Source prefixes counted per attack (the sampled drops of others are
/// counted in the whole only).
pub const MAX_TRACKED: usize = 4_096;
/// Source prefixes a record names.
pub const TOP_SOURCES: usize = 10;
/// Actions a record keeps (the rest are counted).
pub const MAX_ACTIONS: usize = 100;
/// Refused source prefixes remembered per attack to tell the conforming
/// ones apart (past it, the record says nothing of them).
pub const MAX_REFUSED: usize = 4 * MAX_TRACKED;
/// One sampled drop stands for this many.
const SAMPLE: u64 = limiter_common::DROP_SAMPLE as u64;

/// What the detector says of a second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An attack began (its record so far).
    Started(Attack),
    /// It refuses at least twice the most it had been told at.
    Grew(Attack),
    /// It ended (its whole record).
    Ended(Attack),
}

/// An attack being built: from the first second above a threshold
/// (`pending` until it has lasted `sustain`).
#[derive(Debug)]
struct Building {
    attack: Attack,
    pending: bool,
    /// The last second above a threshold.
    last_above: u64,
    /// The peak (packets a second) last told.
    told: u64,
    reasons: [u64; REASON_COUNT],
    classes: HashMap<u8, u64>,
    sources: HashMap<BucketKey, u64>,
    /// Sampled drops by IP protocol and destination port.
    ports: HashMap<(u8, u16), u64>,
    /// Every source prefix a sampled or copied drop named, and whether
    /// more were than [`MAX_REFUSED`].
    refused: HashSet<BucketKey>,
    refused_overflow: bool,
    /// Passed frames drawn, by source prefix: the packets each stands
    /// for (its draw's one in N); those of prefixes past
    /// [`MAX_TRACKED`] in the sum only.
    passes: HashMap<BucketKey, u64>,
    passes_untracked: u64,
    pass_samples: u64,
}

/// The detector: one attack at a time.
#[derive(Debug)]
pub struct Detector {
    settings: Settings,
    building: Option<Building>,
    /// The next attack's id.
    next_id: u64,
}

/// Packets and bytes refused in `t`: dropped (SYN cookies answered
/// included) and would-be dropped in shadow.
pub(crate) fn refused(t: &Totals) -> Amount {
    let (d, s) = (t.dropped(), t.of(limiter_common::Action::ShadowDrop));
    Amount { packets: d.packets + s.packets, bytes: d.bytes + s.bytes }
}

fn add(a: &mut Amount, packets: u64, bytes: u64) {
    a.packets += packets;
    a.bytes += bytes;
}

/// `n` of `all` as a share from 0 to 1.
#[expect(clippy::cast_precision_loss, reason = "a share")]
fn share(n: u64, all: u64) -> f64 {
    if all == 0 { 0.0 } else { n as f64 / all as f64 }
}

impl Detector {
    /// A detector whose first attack is `next_id`.
    #[must_use]
    pub fn new(settings: Settings, next_id: u64) -> Self {
        Self { settings, building: None, next_id: next_id.max(1) }
    }

    /// The policy's `[attacks]` changed: the attack going on keeps going.
    pub fn set(&mut self, settings: Settings) {
        self.settings = settings;
    }

    /// Whether an attack goes on (not one still pending).
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.building.as_ref().is_some_and(|b| !b.pending)
    }

    /// Whether an attack is being built: `Some(true)` while it is still
    /// pending (above a threshold for less than `sustain`).
    #[must_use]
    pub fn building(&self) -> Option<bool> {
        self.building.as_ref().map(|b| b.pending)
    }

    /// The source prefixes the attack being built (pending or not) names
    /// now, most first.
    #[must_use]
    pub fn top_sources(&self) -> Vec<ipnet::IpNet> {
        let Some(b) = &self.building else { return Vec::new() };
        let mut sources: Vec<(&BucketKey, &u64)> = b.sources.iter().collect();
        sources.sort_by(|x, y| y.1.cmp(x.1));
        sources.into_iter().take(TOP_SOURCES).map(|(k, _)| crate::dataplane::net(k)).collect()
    }

    /// The attack going on (not one still pending), as its record so far.
    #[must_use]
    pub fn active(&self, class_names: &[String]) -> Option<Attack> {
        self.building.as_ref().filter(|b| !b.pending).map(|b| snapshot(b, class_names))
    }

    /// Second `at`, in which the program counted `delta`.
    pub fn second(&mut self, at: u64, delta: &Totals, class_names: &[String]) -> Option<Event> {
        let seen = refused(delta);
        let bits = seen.bytes.saturating_mul(8);
        let above = seen.packets >= self.settings.drops_per_sec || bits >= self.settings.bits_per_sec;
        if self.building.is_none() && above {
            let trigger = if seen.packets >= self.settings.drops_per_sec { "drops_per_sec" } else { "bits_per_sec" };
            self.building = Some(Building {
                attack: Attack {
                    id: 0,
                    started: at,
                    ended: None,
                    duration_secs: 0,
                    trigger: trigger.into(),
                    peak_pps: 0,
                    peak_bps: 0,
                    refused: Amount::default(),
                    passed: Amount::default(),
                    shadow: Amount::default(),
                    syn_cookies: 0,
                    reasons: Vec::new(),
                    classes: Vec::new(),
                    sources: Vec::new(),
                    ports: Vec::new(),
                    samples: 0,
                    actions: Vec::new(),
                    actions_left_out: 0,
                    interrupted: false,
                    pcap: None,
                    conforming: None,
                },
                pending: true,
                last_above: at,
                told: 0,
                reasons: [0; REASON_COUNT],
                classes: HashMap::new(),
                sources: HashMap::new(),
                ports: HashMap::new(),
                refused: HashSet::new(),
                refused_overflow: false,
                passes: HashMap::new(),
                passes_untracked: 0,
                pass_samples: 0,
            });
        }
        let building = self.building.as_mut()?;
        if building.pending && !above {
            // Not sustained: not an attack.
            self.building = None;
            return None;
        }
        let a = &mut building.attack;
        add(&mut a.refused, seen.packets, seen.bytes);
        let p = delta.passed();
        let s = delta.of(limiter_common::Action::ShadowDrop);
        add(&mut a.passed, p.packets - s.packets.min(p.packets), p.bytes - s.bytes.min(p.bytes));
        add(&mut a.shadow, s.packets, s.bytes);
        a.syn_cookies += delta.get(Reason::SynCookieSent).packets;
        for reason in Reason::ALL {
            if reason.action() != limiter_common::Action::Pass {
                building.reasons[reason as usize] += delta.get(reason).packets;
            }
        }
        a.peak_pps = a.peak_pps.max(seen.packets);
        a.peak_bps = a.peak_bps.max(bits);
        if above {
            // (A clock stepped back never moves it back.)
            building.last_above = building.last_above.max(at);
        }
        a.duration_secs = building.last_above.saturating_sub(a.started) + 1;
        if building.pending {
            if (at + 1).saturating_sub(a.started) < self.settings.sustain.as_secs() {
                return None;
            }
            building.pending = false;
            a.id = self.next_id;
            self.next_id += 1;
            building.told = a.peak_pps;
            return Some(Event::Started(snapshot(building, class_names)));
        }
        if at.saturating_sub(building.last_above) >= self.settings.quiet.as_secs() {
            let mut done = self.building.take()?;
            done.attack.ended = Some(done.last_above);
            return Some(Event::Ended(snapshot(&done, class_names)));
        }
        if a.peak_pps >= building.told.saturating_mul(2) {
            building.told = a.peak_pps;
            return Some(Event::Grew(snapshot(building, class_names)));
        }
        None
    }

    /// A drop the program sampled (or would drop, in shadow).
    pub fn sampled(&mut self, key: &BucketKey, reason: u32, port: Option<(u8, u16)>) {
        let Some(b) = &mut self.building else { return };
        if reason == Reason::SynCookieVerified as u32 {
            return;
        }
        b.attack.samples += 1;
        *b.classes.entry(key.class).or_default() += 1;
        // A source prefix whatever the class its packets fell in.
        let prefix = BucketKey { class: 0, ..*key };
        refuse(b, prefix);
        if b.sources.len() < MAX_TRACKED || b.sources.contains_key(&prefix) {
            *b.sources.entry(prefix).or_default() += 1;
        }
        if let Some(port) = port
            && (b.ports.len() < MAX_TRACKED || b.ports.contains_key(&port))
        {
            *b.ports.entry(port).or_default() += 1;
        }
    }

    /// A frame the program copied, from source `prefix` (its bucket's
    /// key, of class 0): refused, or passed as one in `one_in` drawn at
    /// random.
    pub fn frame(&mut self, prefix: &BucketKey, passed: bool, one_in: u32) {
        let Some(b) = &mut self.building else { return };
        if !passed {
            refuse(b, *prefix);
            return;
        }
        b.pass_samples += 1;
        let weight = u64::from(one_in.max(1));
        if b.passes.len() < MAX_TRACKED || b.passes.contains_key(prefix) {
            *b.passes.entry(*prefix).or_default() += weight;
        } else {
            b.passes_untracked += weight;
        }
    }

    /// Whether it wants passed frames (an attack is being built).
    #[must_use]
    pub fn wants_passes(&self) -> bool {
        self.building.is_some()
    }

    /// The guard did `what` (asked by `by`) during the attack.
    pub fn action(&mut self, action: AttackAction) {
        let Some(b) = &mut self.building else { return };
        if b.attack.actions.len() < MAX_ACTIONS {
            b.attack.actions.push(action);
        } else {
            b.attack.actions_left_out += 1;
        }
    }
}

/// Source `prefix` was refused during `b`.
fn refuse(b: &mut Building, prefix: BucketKey) {
    if b.refused.len() < MAX_REFUSED {
        b.refused.insert(prefix);
    } else if !b.refused.contains(&prefix) {
        b.refused_overflow = true;
    }
}

/// What the never-refused sources of `b` got: their share of the passed
/// frames drawn (each weighed by the packets it stands for) applied to
/// all the passed packets. Those of prefixes past the bound count as
/// refused (never more protection said than seen).
fn conforming(b: &Building) -> Option<Conforming> {
    if b.pass_samples == 0 || b.refused_overflow {
        return None;
    }
    let all = b.passes.values().sum::<u64>() + b.passes_untracked;
    let (mut weight, mut prefixes) = (0u64, 0u64);
    for (prefix, w) in &b.passes {
        if !b.refused.contains(prefix) {
            weight += w;
            prefixes += 1;
        }
    }
    let share = share(weight, all);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an estimate"
    )]
    let packets = (b.attack.passed.packets as f64 * share).round() as u64;
    Some(Conforming { packets, share, prefixes, samples: b.pass_samples })
}

/// `b`'s record as it stands: its reasons, classes and sources ranked.
fn snapshot(b: &Building, class_names: &[String]) -> Attack {
    let mut a = b.attack.clone();
    a.conforming = conforming(b);
    let counted: u64 = b.reasons.iter().sum();
    let mut reasons: Vec<Share> = Reason::ALL
        .iter()
        .filter(|r| b.reasons[**r as usize] > 0)
        .map(|r| {
            let n = b.reasons[*r as usize];
            Share { name: r.label().into(), packets: n, share: share(n, counted), country: None, asn: None }
        })
        .collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.packets));
    a.reasons = reasons;
    let mut classes: Vec<Share> = b
        .classes
        .iter()
        .map(|(c, n)| {
            let name = class_names.get(usize::from(*c)).cloned().unwrap_or_else(|| format!("class {c}"));
            Share { name, packets: n * SAMPLE, share: share(*n, a.samples), country: None, asn: None }
        })
        .collect();
    classes.sort_by(|x, y| y.packets.cmp(&x.packets).then_with(|| x.name.cmp(&y.name)));
    a.classes = classes;
    let mut sources: Vec<(&BucketKey, &u64)> = b.sources.iter().collect();
    sources.sort_by(|x, y| y.1.cmp(x.1));
    a.sources = sources
        .into_iter()
        .take(TOP_SOURCES)
        .map(|(k, n)| Share {
            name: crate::dataplane::net(k).to_string(),
            packets: n * SAMPLE,
            share: share(*n, a.samples),
            country: None,
            asn: None,
        })
        .collect();
    let mut ports: Vec<(&(u8, u16), &u64)> = b.ports.iter().collect();
    ports.sort_by(|x, y| y.1.cmp(x.1).then_with(|| x.0.cmp(y.0)));
    a.ports = ports
        .into_iter()
        .take(TOP_SOURCES)
        .map(|((proto, port), n)| Share {
            name: port_name(*proto, *port),
            packets: n * SAMPLE,
            share: share(*n, a.samples),
            country: None,
            asn: None,
        })
        .collect();
    a
}

/// `tcp/443`, `udp/53`.
fn port_name(proto: u8, port: u16) -> String {
    format!("{}/{port}", crate::capture::protocol(proto))
}

#[cfg(test)]
mod tests;
