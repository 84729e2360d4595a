//! The control socket: a Unix stream socket (no TCP listener, ever), one
//! JSON request per line and one JSON response per line. The daemon checks
//! each peer's credentials (SO_PEERCRED): root, or a member of the
//! configured group.

mod attacks;
mod capture;
pub mod client;
mod explain;
mod forward;
mod groups;
mod history;
mod prefixes;
pub mod server;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use self::attacks::{Action as AttackAction, Amount, Attack, Attacks, Conforming, Pcap, Share};
pub use self::capture::{Captured, WireFrame};
pub use self::explain::{Explain, Layer};
pub use self::forward::{AdaptiveInfo, ForwardInfo};
pub use self::groups::{GroupRate, GroupShow};
pub use self::history::{History, Record};
pub use self::prefixes::{LayerEntry, MAX_LISTED_DECISIONS, PrefixEntry, PrefixList, Shown};
use crate::policy::Action;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/limiter/limiter.sock";

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    /// The tunnels' backends (`limiter backend list`).
    Tunnels,
    /// Drain (or undrain) the backend at `address` in every tunnel that
    /// has it: it keeps its flows and gets no new ones.
    BackendDrain {
        address: std::net::IpAddr,
        drain: bool,
    },
    /// The fleet sync: store, nodes, last sync, errors.
    FleetStatus,
    /// A prefix's window counts: local, the fleet's, what is left (an
    /// address is asked as its host network).
    PrefixShow {
        cidr: IpNet,
    },
    /// The verdict a packet from `addr` would get now, layer by layer.
    Explain {
        addr: std::net::IpAddr,
        #[serde(default)]
        protocol: crate::policy::Protocol,
        #[serde(default)]
        port: Option<u16>,
        /// A TCP SYN without ACK.
        #[serde(default)]
        syn: bool,
    },
    Stats,
    /// The audit trail: the changes since `since` (Unix time), at most
    /// `limit`, newest last.
    History {
        #[serde(default)]
        since: Option<u64>,
        limit: usize,
    },
    /// Open a capture tap (`limiter capture`): answered with its first
    /// (empty) batch, which names it.
    CaptureOpen {
        filter: crate::capture::Filter,
    },
    /// The frames tap `id` took since the last read.
    CaptureRead {
        id: u64,
    },
    /// Close tap `id`.
    CaptureClose {
        id: u64,
    },
    /// The attacks kept (the last `limit`), or the one `id`.
    Attacks {
        #[serde(default)]
        id: Option<u64>,
        limit: usize,
    },
    PolicyShow,
    /// Apply policy text (named for error messages), or re-read the
    /// daemon's own policy source when `text` is absent.
    PolicyApply {
        name: String,
        text: Option<String>,
        /// Apply even if it lifts most overrides or cuts a rate more than
        /// 10x (`--force`).
        #[serde(default)]
        force: bool,
    },
    PrefixList,
    PrefixSet {
        cidr: IpNet,
        rate: u64,
        burst: u64,
        /// Expire after this many seconds (`None`: never).
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// Why (`--reason`), shown by `prefix list`, `explain` and the
        /// audit trail.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    PrefixAllow {
        cidr: IpNet,
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// Why (`--reason`), shown by `prefix list`, `explain` and the
        /// audit trail.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    PrefixDeny {
        cidr: IpNet,
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// `--upstream`: announced upstream too, for the same time, or
        /// nothing done (the answer's [`Applied::upstream`] says what the
        /// speaker holds).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        upstream: bool,
        /// Why (`--reason`), shown by `prefix list`, `explain` and the
        /// audit trail.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A penalty from the tenant layer's feedback: deny `cidr` for
    /// `ttl_secs`, under the governor. The tenant's text as sent: the
    /// governor parses it and counts a bad one as a refusal.
    Penalty {
        cidr: String,
        ttl_secs: u64,
        reason: String,
    },
    /// Allow or deny every CIDR of `cidrs` as one version, all or nothing.
    PrefixLoad {
        cidrs: Vec<IpNet>,
        action: Action,
        #[serde(default)]
        ttl_secs: Option<u64>,
    },
    PrefixUnset {
        cidr: IpNet,
    },
    /// Unset every entry of these layers (`runtime`: the operator's,
    /// `feedback`, `escalation`) as one change.
    PrefixUnsetAll {
        origins: Vec<crate::origin::Origin>,
    },
    /// The `n` prefixes with the most drops recently.
    Top {
        n: usize,
    },
    /// The tenant layer rejected `rejected` connections of forwarder
    /// `forward` (feedback's `POST /v1/load`): its adaptive throttling
    /// counts them as requests not accepted.
    Load {
        forward: String,
        rejected: u64,
    },
    /// `limiter upstream list`: the rules announced upstream and the
    /// speaker's sessions.
    UpstreamList,
    /// `limiter upstream announce|blackhole`, `limiter prefix deny
    /// --upstream`: a FlowSpec rule on source `cidr` (or a blackhole of
    /// destination `cidr`), for `ttl_secs` (`None`: the policy's ttl).
    UpstreamAnnounce {
        cidr: IpNet,
        #[serde(default)]
        blackhole: bool,
        #[serde(default)]
        destination: Option<IpNet>,
        /// An IP protocol number.
        #[serde(default)]
        protocol: Option<u8>,
        /// Bytes a second (`None`: discard).
        #[serde(default)]
        rate_limit: Option<u64>,
        #[serde(default)]
        ttl_secs: Option<u64>,
    },
    /// `limiter upstream withdraw`: the rules of `cidr` (`None`: all).
    UpstreamWithdraw {
        #[serde(default)]
        cidr: Option<IpNet>,
    },
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    Status(StatusInfo),
    Stats(StatsInfo),
    Policy(PolicyText),
    Prefixes(PrefixList),
    Applied(Applied),
    Top(TopInfo),
    /// `None`: no `[fleet]` in the policy the daemon started with.
    Fleet {
        status: Option<crate::fleet::FleetStatus>,
    },
    PrefixShow(PrefixShow),
    Explain(Box<Explain>),
    History(History),
    Attacks(Attacks),
    /// A capture tap's frames.
    Captured(Captured),
    /// A forwarder's adaptive throttling after a `Load`.
    Adaptive(AdaptiveInfo),
    /// The rules announced upstream.
    Upstream(crate::upstream::UpstreamInfo),
    /// The tunnels and their backends.
    Tunnels(crate::tunnel::TunnelsInfo),
    /// Not done: why, in a word a program can act on and a sentence for
    /// the operator.
    Error {
        /// Absent in the answers of an earlier build (read as `refused`).
        #[serde(default)]
        code: ErrorCode,
        message: String,
        /// The refused entry of a bulk load (0-based); `message` is then
        /// that entry's own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
}

/// Why the daemon did not do what was asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The peer may not use the control socket.
    Denied,
    /// Not a request the daemon reads: bad JSON, too long, too slow.
    BadRequest,
    /// Too many requests wait for a policy change to finish; retry.
    Busy,
    /// The daemon could not read its maps, or is stopping.
    Unavailable,
    /// The change is refused; the policy in force keeps running.
    #[default]
    Refused,
    /// A penalty inside an allow of the operator or the policy file.
    Conflict,
    /// A penalty past automation's cap of denied prefixes.
    Capped,
}

impl Response {
    /// An error answer about no entry in particular.
    #[must_use]
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Response::Error { code, message: message.into(), entry: None }
    }
}

/// `limiter prefix show`: a bucket prefix's window quotas now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefixShow {
    /// The bucket prefix the address or CIDR falls in.
    pub cidr: IpNet,
    pub windows: Vec<WindowRow>,
    /// Its country, ASN and group (none: the policy names no group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupShow>,
    /// The rules announced upstream whose source network holds it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<crate::upstream::rule::Rule>,
}

/// One window-quota class of a prefix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    pub class: String,
    pub scope: crate::policy::Scope,
    pub limit: u64,
    pub window_secs: f64,
    pub slices: u32,
    /// Counted on this node in the current window.
    pub local: u64,
    /// The other nodes' count as last synced (0 for local scope).
    pub fleet: u64,
    pub remaining: u64,
}

/// The policy in force, as a policy file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyText {
    pub version: u64,
    pub source: String,
    pub text: String,
}

/// A policy version applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub version: u64,
    pub summary: String,
    /// A `prefix deny --upstream`'s announcement: the rules announced
    /// upstream after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<crate::upstream::UpstreamInfo>,
}

impl Response {
    /// The `kind` tag of this answer.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Status(_) => "status",
            Response::Stats(_) => "stats",
            Response::Policy(_) => "policy",
            Response::Prefixes(_) => "prefixes",
            Response::Applied(_) => "applied",
            Response::Top(_) => "top",
            Response::Fleet { .. } => "fleet",
            Response::PrefixShow(_) => "prefix show",
            Response::Explain(_) => "explain",
            Response::History(_) => "history",
            Response::Attacks(_) => "attacks",
            Response::Captured(_) => "captured",
            Response::Adaptive(_) => "adaptive",
            Response::Upstream(_) => "upstream",
            Response::Tunnels(_) => "tunnels",
            Response::Error { .. } => "error",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopInfo {
    /// Seconds the offender rates are averaged over.
    pub window_secs: u64,
    /// One drop in this many (per CPU) is sampled.
    pub sample_every: u32,
    /// Packets per second, one entry a second, oldest first.
    pub passed_per_sec: Vec<u64>,
    pub dropped_per_sec: Vec<u64>,
    pub offenders: Vec<Offender>,
    /// The prefixes shadow mode would drop most (passed, counted as
    /// `shadow_dropped`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadow: Vec<Offender>,
    /// Each country or ASN group's packets in the last second.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupRate>,
    /// Each tunnel's backends and what the program forwarded to each in
    /// the last second.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<crate::tunnel::BackendRate>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offender {
    pub prefix: IpNet,
    pub class: String,
    /// Estimated from samples.
    pub drops_per_sec: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusInfo {
    pub iface: String,
    pub attach_mode: String,
    /// Whether the program is on the interface now (checked every second).
    pub attached: bool,
    /// Why not, when it is not.
    pub detached_reason: Option<String>,
    /// Times the daemon put back a lost link or pin since it started.
    pub reattaches: u64,
    /// The forwarders to the tenant layer.
    #[serde(default)]
    pub forwards: Vec<ForwardInfo>,
    pub pin_dir: Option<String>,
    pub policy_version: u64,
    pub policy_source: String,
    pub policy: String,
    pub capacity: u32,
    pub tracked: usize,
    /// When the count of `tracked` began (Unix ms): it is taken in the
    /// background, every 2 s or less often while counts take long.
    #[serde(default)]
    pub tracked_at_ms: u64,
    pub passed_packets: u64,
    pub dropped_packets: u64,
    pub uptime_secs: u64,
    pub last_reload: Option<ReloadInfo>,
    /// Why the kernel refuses the connections of the SYN cookies XDP
    /// verified, when it does (and what to do).
    #[serde(default)]
    pub syn_cookies_failing: Option<String>,
    /// The classes whose out-of-state TCP check judges now.
    #[serde(default)]
    pub tcp_state_judging: Vec<String>,
    /// Under a libxdp dispatcher: the limiter's run priority and the other
    /// programs (name, program id, run priority), in run order.
    #[serde(default)]
    pub dispatcher: Option<(u32, Vec<Neighbour>)>,
    /// What the kernel lacks for SYN cookies, when the program runs
    /// without them.
    #[serde(default)]
    pub kernel_lacks: Option<String>,
    /// The deny set's networks by origin (`feed:NAME`, `crowdsec:...`).
    #[serde(default)]
    pub deny_set: Vec<(String, usize)>,
    /// CrowdSec's Local API as the last pulls found it, with `[crowdsec]`.
    #[serde(default)]
    pub crowdsec: Option<String>,
    /// The BGP speaker, its sessions and the rules announced, with
    /// `[upstream]`.
    #[serde(default)]
    pub upstream: Option<String>,
    /// The attack going on, if one does, and each webhook's deliveries.
    #[serde(default)]
    pub attacks: Option<String>,
    /// Whether the program copies dropped frames, and for whom.
    #[serde(default)]
    pub capture: Option<String>,
    /// Each tunnel's backends up, with `[[tunnel]]`.
    #[serde(default)]
    pub tunnels: Option<String>,
}

/// Another program under the same libxdp dispatcher: its name, program
/// id and run priority.
pub type Neighbour = (String, u32, u32);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadInfo {
    pub ok: bool,
    pub message: String,
    pub unix_time: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsInfo {
    pub reasons: Vec<ReasonRow>,
    pub classes: Vec<ClassRow>,
    /// Classes with SYN cookies and whether they answer with them now.
    #[serde(default)]
    pub syn_cookies: Vec<SynCookieRow>,
    /// Classes that judge out-of-state TCP and whether they do now.
    #[serde(default)]
    pub tcp_state: Vec<TcpStateRow>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpStateRow {
    pub class: String,
    /// `auto` or `always`.
    pub mode: crate::policy::TcpState,
    /// Judging now (`always`, or `auto` engaged).
    pub engaged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynCookieRow {
    pub class: String,
    /// `auto` or `always`.
    pub mode: crate::policy::SynCookies,
    pub engaged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonRow {
    pub reason: String,
    /// The XDP verdict (`pass` for a shadow drop).
    pub verdict: String,
    /// `pass`, `drop` or `shadow_drop`: the metrics' `action` label
    /// (empty from a daemon of a build before it).
    #[serde(default)]
    pub action: String,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassRow {
    pub class: String,
    pub admitted: u64,
    pub dropped: u64,
    pub shadow_dropped: u64,
}

#[cfg(test)]
mod tests;
