//! `limiter attacks`: the attacks the guard saw, as the daemon keeps and
//! answers them (one JSON line each in its attacks file, and the body of
//! a webhook's `attack` field). The schema is docs/attacks.md's.

use serde::{Deserialize, Serialize};

/// Packets and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub packets: u64,
    pub bytes: u64,
}

/// A name (a reason, a class) and the packets counted under it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub name: String,
    /// Packets (for a class and a source: estimated from the sampled
    /// drops, one in 64).
    pub packets: u64,
    /// Its part of all the refused packets (0 to 1; for a reason of the
    /// counted ones).
    pub share: f64,
    /// A source's country and AS, as the loaded group files say
    /// (`limiter prefix show`'s); absent when none says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
}

impl Eq for Share {}

/// What the guard did during an attack: a change of its policy state
/// (whoever made it), an announcement upstream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// Unix time.
    pub at: u64,
    /// As the audit trail names them: `escalation`, `feed:NAME`, `uid 0
    /// pid 4242`, ...
    pub by: String,
    pub what: String,
    pub ok: bool,
}

/// One attack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attack {
    /// Counts up from 1 across restarts (the attacks file keeps them).
    pub id: u64,
    /// Unix times: the first second above a threshold, and the last
    /// (`None` while it goes on).
    pub started: u64,
    #[serde(default)]
    pub ended: Option<u64>,
    /// Seconds from start to the last second above a threshold (so far).
    pub duration_secs: u64,
    /// The threshold it met first: `drops_per_sec` or `bits_per_sec`.
    pub trigger: String,
    /// The most refused in one second, packets and bits.
    pub peak_pps: u64,
    pub peak_bps: u64,
    /// Refused (dropped, would-be dropped in shadow, answered with a SYN
    /// cookie) and passed, from its start to now or its end.
    pub refused: Amount,
    pub passed: Amount,
    /// Of the refused, those only shadow mode let through.
    pub shadow: Amount,
    /// SYNs answered with a cookie.
    pub syn_cookies: u64,
    /// The refused packets by reason, most first.
    pub reasons: Vec<Share>,
    /// The sampled refused packets by class, most first.
    pub classes: Vec<Share>,
    /// The source prefixes refused most (up to 10), from the sampled
    /// drops, with their share of all the sampled drops.
    pub sources: Vec<Share>,
    /// The destination ports refused most (up to 10: `udp/7001`), from
    /// the sampled drops of TCP and UDP, with their share of all the
    /// sampled drops.
    #[serde(default)]
    pub ports: Vec<Share>,
    /// Sampled drops it was told of (the sources' and classes' base).
    pub samples: u64,
    /// What the guard did meanwhile (up to 100; `actions_left_out` more).
    pub actions: Vec<Action>,
    #[serde(default)]
    pub actions_left_out: u64,
    /// The daemon stopped while it went on: its end is the last second
    /// recorded.
    #[serde(default)]
    pub interrupted: bool,
    /// Its frames, as pcapng (none: no attacks file to keep them beside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcap: Option<Pcap>,
    /// What the sources it never refused got (none: no passed frame was
    /// drawn, or too many sources were refused to tell them apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conforming: Option<Conforming>,
}

/// The passed packets of the source prefixes an attack never refused
/// (the traffic the guard is there for), estimated from passed frames
/// the program drew at random while it went on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Conforming {
    /// Their passed packets: all the passed packets times their share.
    pub packets: u64,
    /// Their share of the passed packets (0 to 1), by the drawn frames.
    pub share: f64,
    /// Source prefixes seen passing and never refused.
    pub prefixes: u64,
    /// Passed frames drawn (the estimate's base).
    pub samples: u64,
}

impl Eq for Conforming {}

/// An attack's pcapng: the first frames it dropped, then a random sample.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pcap {
    pub path: String,
    pub frames: u64,
    pub bytes: u64,
    /// It reached its bound in bytes: later frames were not kept.
    pub full: bool,
}

/// The attacks `limiter attacks` asks for, newest last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attacks {
    pub attacks: Vec<Attack>,
    /// The file they are kept in (none: in memory only, since the daemon
    /// started).
    pub file: Option<String>,
}
