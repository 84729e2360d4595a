//! Userspace of the XDP flood guard, one room per responsibility; a room
//! only uses rooms listed above it, and a feature's room (marked so) uses
//! no other feature's (see docs/design.md):
//!
//! - `capture`: the frames the program copied at the driver, filtered,
//!   handed to taps, written as pcapng;
//! - `clock`: the wall clock, read one way;
//! - `origin`: who decided, one table for every author of a decision;
//! - `counts`: counters kept by the variants of an enum;
//! - `series`: how a room's report writes its own Prometheus series;
//! - `listen`: what every listener shares (fair slots per peer, bounds);
//! - `watch`: a file source that stamps, settles and re-reads;
//! - `nets`: what the sources of networks share (special-purpose
//!   networks, coarsening to bucket prefixes, the shrink guard);
//! - `policy::error`, `policy::duration`, `policy::words`: what every
//!   section says a refusal, a duration and a decision with;
//! - `groups::section` (feature): the `[[group]]` section, groups' own;
//! - `sources`, `sources::section` (feature): the kinds of `[[source]]`
//!   file (each a reader in its own folder) and the section;
//! - `policy`: the model, the file, the overlay, the one compile;
//! - `records`: files of JSON-line records the daemon keeps, bounded,
//!   rotated, read back, written off the loop;
//! - `crowdsec` (feature): decisions read from CrowdSec's Local API, typed;
//! - `dataplane`: loading, attaching, pinning, typed maps, counters;
//! - `fleet` (feature): window quotas kept across hosts through Redis;
//! - `upstream` (feature): rules announced to the transit through a BGP
//!   speaker;
//! - `control`: the control-socket protocol, server and client;
//! - `sockets`: the kernel's TCP socket tables (`/proc/net/tcp{,6}`);
//! - `top`, `replay`: top offenders, offline replay;
//! - `engine::error`: why a change of the policy state was refused;
//! - `sources::layer` (feature): the sources' layer of the policy state;
//! - `groups::layer` (feature): the groups' layer of the policy state;
//! - `engine`: what the loop and its features share (the policy state,
//!   changes, the sink of decisions, a feature's hooks), naming no
//!   feature;
//! - `feeds` (feature): blocklist files read into sets of networks,
//!   checked, diffed, and watched;
//! - `groups` (feature): the country and ASN of networks, read from
//!   MaxMind databases and CSV lists, and watched (its section and its
//!   layer, listed above, are in its folder too);
//! - `sources::feature` (feature): the sources' watcher (its kinds, its
//!   section and its layer, listed above, are in its folder too);
//! - `forward` (feature): the forwarder to the tenant layer (PROXY
//!   protocol);
//! - `feedback` (feature): the tenant layer's penalties over HTTP,
//!   escalation, and proof of source;
//! - `crowdsec::feature`, `fleet::feature`, `upstream::feature` (feature):
//!   the faces of features whose rooms sit above the engine (the engine
//!   and `control` read them), listed apart below it;
//! - `trail` (feature): the audit trail, every change with who made it,
//!   logged, written to a bounded history file, and `limiter history`;
//! - `attacks` (feature): attacks detected from what the guard refuses,
//!   kept as records with what it did meanwhile and a pcap of what was
//!   dropped, told to webhooks, and `limiter attacks`;
//! - `cookies` (feature): SYN cookies' daemon part, keeping the kernel
//!   taking the ACKs of the cookies XDP verified;
//! - `tcp_state` (feature): out-of-state TCP's daemon part, saying when
//!   a class's `auto` check engages and lets go;
//! - `metrics`: Prometheus, the data plane's series then each feature's;
//! - `daemon`: the running daemon, the one place that names every
//!   feature;
//! - `cli` and `cmd`: the command line and its verbs.
//!
//! The binary in `main.rs` is a thin shell over `cmd`.

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit this binary was built from (`-dirty` if the tree
/// differed from it; `unknown` from a tree without git history).
pub const GIT_REVISION: &str = env!("LIMITER_GIT_REV");
/// `limiter --version`: `0.1.0 (git 0123456789ab)`.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("LIMITER_GIT_REV"), ")");

/// `text` with every control character (newlines, escapes, NUL, ...)
/// written as `\u{..}`: what an outsider sends and a log line, the status
/// or a JSON answer shows must not forge a line or drive a terminal.
#[must_use]
pub fn escape_control(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` as one line of at most `max` bytes: control characters escaped
/// (see [`escape_control`]), cut at a character boundary with `...`.
#[must_use]
pub fn one_line(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < text.len() { "..." } else { "" };
    format!("{}{cut}", escape_control(&text[..end]))
}

pub mod capture;
pub mod clock;
pub mod counts;
pub mod listen;
pub mod nets;
pub mod origin;
pub mod policy;
pub mod records;
pub mod series;
pub mod sources;
pub mod watch;

pub mod crowdsec;
pub mod dataplane;
pub mod fleet;
pub mod upstream;

pub mod control;
pub mod replay;
pub mod sockets;
pub mod top;

pub mod engine;

pub mod attacks;
pub mod cookies;
pub mod feedback;
pub mod feeds;
pub mod forward;
pub mod groups;
pub mod tcp_state;
pub mod trail;
pub mod tunnel;

pub mod metrics;

pub mod daemon;

pub mod cli;
pub mod cmd;

#[cfg(test)]
mod compat;
#[cfg(test)]
mod layering;

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(super::escape_control("a\nb\u{1b}[31mc\u{7f}é"), "a\\u{a}b\\u{1b}[31mc\\u{7f}é");
        assert_eq!(super::escape_control("credential stuffing"), "credential stuffing");
    }
}
