//! `limiter history`: the audit trail's records, as the daemon keeps and
//! answers them (one JSON line each in its history file).

use serde::{Deserialize, Serialize};

/// One change of the policy state, whoever made it, and how it went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Unix time it finished.
    pub at: u64,
    /// The policy version in force after it.
    pub version: u64,
    /// Who made it: `uid 0 pid 4242` (a control client, as the kernel
    /// names it), `tenant 198.18.0.9` (the feedback endpoint's peer),
    /// `sighup`, `feed:NAME`, `crowdsec:...`, `group:NAME`,
    /// `source:NAME`, `escalation`, `expiry`; automation's own notes
    /// (`pressure`, `syn cookies (auto)`).
    pub by: String,
    /// What was asked: `prefix deny 198.18.7.0/24 ttl 3600`, `policy
    /// /etc/limiter/limiter.toml sha256 ...`, ...
    pub change: String,
    pub ok: bool,
    /// The summary of the version it made, or why it was refused.
    pub result: String,
}

/// Records `limiter history` asks for, newest last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub records: Vec<Record>,
    /// The file they are kept in (none: kept in memory only, since the
    /// daemon started).
    pub file: Option<String>,
}
