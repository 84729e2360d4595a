//! The audit trail as the daemon's feature: told of every change that
//! finished (who asked, what, how it went), it logs one line, queues the
//! record for the history file, keeps the last ones, and answers
//! `limiter history`.

use std::collections::VecDeque;

use super::{KEPT, MAX_FILE, field};
use crate::control::{History, Record, Request, Response};
use crate::engine::feature::{Applied, Feature, InForce, Note};

/// The trail.
#[derive(Debug)]
pub(crate) struct Trail {
    file: Option<std::path::PathBuf>,
    writer: Option<crate::records::Writer>,
    kept: VecDeque<Record>,
    /// The policy in force as last told (version, file and its hash).
    version: u64,
    policy: String,
}

impl Trail {
    /// The trail, writing to `file` if given (its last records read back
    /// first).
    pub(crate) fn start(file: Option<std::path::PathBuf>) -> Self {
        let kept = file.as_deref().map(|f| super::read_back(f, KEPT)).unwrap_or_default();
        let writer = file.clone().map(|f| crate::records::Writer::start("history", f, MAX_FILE));
        Self { file, writer, kept, version: 0, policy: String::new() }
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
        if let Some(w) = &mut self.writer {
            w.write(&r);
        }
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(r);
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
        let (who, what) = a.change.describe(a.ok.then_some(self.policy.as_str()));
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
        let Some((change, ok, result)) = crate::engine::feature::answered_change(req, answer) else { return };
        self.record(Record {
            at: crate::clock::unix_now(),
            version: self.version,
            by: field(&by.to_string()),
            change: field(&change),
            ok,
            result: field(&result),
        });
    }

    /// Automation's announcements upstream and their withdrawals.
    fn noted(&mut self, n: &Note) {
        self.record(Record {
            at: crate::clock::unix_now(),
            version: self.version,
            by: field(&n.by),
            change: field(&n.what),
            ok: true,
            result: String::new(),
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
