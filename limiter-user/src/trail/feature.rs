//! The audit trail as the daemon's feature: told of every change that
//! finished (who asked, what, how it went), it logs one line, queues the
//! record for the history file, keeps the last ones, and answers
//! `limiter history`.

use std::collections::VecDeque;

use super::{KEPT, Writer, field};
use crate::control::{History, Record, Request, Response};
use crate::engine::{
    changes::Change,
    feature::{Applied, Feature, InForce},
};
use crate::origin::Origin;

/// The trail.
#[derive(Debug)]
pub(crate) struct Trail {
    file: Option<std::path::PathBuf>,
    writer: Option<Writer>,
    kept: VecDeque<Record>,
    /// Records the writer's queue had no room for.
    lost: u64,
    /// The policy in force as last told (version, file and its hash).
    version: u64,
    policy: String,
}

impl Trail {
    /// The trail, writing to `file` if given (its last records read back
    /// first).
    pub(crate) fn start(file: Option<std::path::PathBuf>) -> Self {
        let kept = file.as_deref().map(|f| super::read_back(f, KEPT)).unwrap_or_default();
        let writer = file.clone().map(Writer::start);
        Self { file, writer, kept, lost: 0, version: 0, policy: String::new() }
    }

    fn record(&mut self, r: Record) {
        let state = if r.ok { "applied" } else { "refused" };
        tracing::info!(
            event = "audit",
            by = %r.by,
            ok = r.ok,
            version = r.version,
            "limiter: audit: {}: {}: {state}: {}",
            r.by,
            r.change,
            r.result
        );
        if let Some(w) = &self.writer
            && let Ok(line) = serde_json::to_string(&r)
            && w.tx.try_send(line).is_err()
        {
            self.lost += 1;
            if self.lost.is_power_of_two() {
                tracing::warn!(
                    "limiter: history: {} record(s) not written (the disk is slow); the log has them",
                    self.lost
                );
            }
        }
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(r);
    }
}

/// Who made `change` when no channel says (SIGHUP, expiry, a source, the
/// daemon's escalation), and what it was.
fn describe(change: &Change, policy: Option<&str>) -> (String, String) {
    let policy = policy.map_or_else(String::new, |p| format!(": {p}"));
    let ttl = |t: &Option<u64>| t.map_or_else(String::new, |t| format!(" ttl {t}"));
    match change {
        Change::Apply { name, text, force } => {
            let what = if text.is_some() { "policy apply (text sent)" } else { "policy apply (its file)" };
            ("operator".into(), format!("{what} {name}{}{policy}", if *force { " --force" } else { "" }))
        }
        Change::Reload => ("sighup".into(), format!("policy reload{policy}")),
        Change::Prefix { cidr, action, ttl: t, upstream, reason } => {
            let action = action.map_or_else(
                || "unset".to_owned(),
                |a| match a {
                    crate::policy::OverrideAction::Limit(l) => format!("set rate {} burst {}", l.rate, l.burst),
                    a => a.action().to_string(),
                },
            );
            let up = if *upstream { " --upstream" } else { "" };
            let why = reason.as_ref().map_or_else(String::new, |r| format!(" reason {r:?}"));
            ("operator".into(), format!("prefix {action} {cidr}{}{up}{why}", ttl(t)))
        }
        Change::Load { cidrs, action, ttl: t } => {
            ("operator".into(), format!("prefix load {action} {} network(s){}", cidrs.len(), ttl(t)))
        }
        Change::Expire => ("expiry".into(), "what reached its end".into()),
        Change::UnsetAll { origins } => {
            let names: Vec<&str> = origins.iter().map(|o| o.label()).collect();
            ("operator".into(), format!("prefix unset every entry of {}", names.join(", ")))
        }
        Change::Penalty { net, ttl: t, reason, by, held } => {
            let net = net.as_ref().map_or_else(|text| format!("{text:?}"), ToString::to_string);
            let evidence = if *held { ", drops of connections this host holds" } else { "" };
            let who = if *by == Origin::Escalation { "escalation" } else { "tenant" };
            (who.into(), format!("penalty deny {net} ttl {t} reason {reason:?}{evidence}"))
        }
        Change::Source(c) => (c.origin().to_string(), "a new version".into()),
    }
}

impl Feature for Trail {
    fn apply(&mut self, a: &InForce<'_>) {
        self.version = a.version;
        self.policy = match a.state.file_sha256() {
            Some(sha) => format!("{} sha256 {sha}", a.state.source()),
            None => a.state.source().to_owned(),
        };
    }

    fn applied(&mut self, a: &mut Applied<'_>) {
        let (who, what) = describe(a.change, a.ok.then_some(self.policy.as_str()));
        let by = a.by.map_or(who, ToString::to_string);
        self.record(Record {
            at: crate::clock::unix_now(),
            version: self.version,
            by: field(&by),
            change: field(&what),
            ok: a.ok,
            result: field(a.line),
        });
    }

    /// The operator's announcements and withdrawals upstream (answered by
    /// the upstream feature, not changes of the policy state).
    fn answered(&mut self, req: &Request, by: &crate::control::server::Requester, answer: &Response) {
        let change = match req {
            Request::UpstreamAnnounce { cidr, blackhole, ttl_secs, .. } => {
                let what = if *blackhole { "blackhole" } else { "announce" };
                let ttl = ttl_secs.map_or_else(String::new, |t| format!(" ttl {t}"));
                format!("upstream {what} {cidr}{ttl}")
            }
            Request::UpstreamWithdraw { cidr } => {
                format!("upstream withdraw {}", cidr.map_or_else(|| "--all".to_owned(), |c| c.to_string()))
            }
            _ => return,
        };
        let (ok, result) = match answer {
            Response::Error { message, .. } => (false, message.clone()),
            Response::Upstream(u) => (true, format!("{} rule(s) wanted upstream", u.rules.len())),
            _ => (true, String::new()),
        };
        self.record(Record {
            at: crate::clock::unix_now(),
            version: self.version,
            by: field(&by.to_string()),
            change: field(&change),
            ok,
            result: field(&result),
        });
    }

    fn answer(&mut self, req: &Request) -> Option<Response> {
        let Request::History { since, limit } = req else { return None };
        let since = since.unwrap_or(0);
        let mut records: Vec<Record> = self.kept.iter().rev().filter(|r| r.at >= since).take(*limit).cloned().collect();
        records.reverse();
        Some(Response::History(History { records, file: self.file.as_ref().map(|f| f.display().to_string()) }))
    }
}
