//! The outcomes of policy changes since start: logged, kept for `status`
//! and the metrics, and answered to the client that asked.

use std::time::Instant;

use crate::control::{Applied, ReloadInfo, Response};
use crate::engine::ApplyError;

/// Policy applies since start, for `status` and the metrics.
#[derive(Debug)]
pub(super) struct Reloads {
    pub(super) started: Instant,
    pub(super) last: Option<ReloadInfo>,
    pub(super) applied: u64,
    pub(super) rejected: u64,
    /// Unix times of the last applied and the last rejected policy.
    pub(super) last_applied: Option<u64>,
    pub(super) last_rejected: Option<u64>,
}

impl Reloads {
    pub(super) fn new() -> Self {
        Self { started: Instant::now(), last: None, applied: 0, rejected: 0, last_applied: None, last_rejected: None }
    }

    /// Record the outcome of a change for `status` and the metrics.
    fn note(&mut self, ok: bool, message: String) {
        let now = crate::clock::unix_now();
        if ok {
            (self.applied, self.last_applied) = (self.applied + 1, Some(now));
        } else {
            (self.rejected, self.last_rejected) = (self.rejected + 1, Some(now));
        }
        self.last = Some(ReloadInfo { ok, message, unix_time: now });
    }

    /// A client's change: logged and recorded; the answer to its client
    /// (`version`: the policy in force after it).
    pub(super) fn changed(&mut self, result: Result<String, ApplyError>, version: u64) -> Response {
        match result {
            Ok(summary) => {
                tracing::info!(event = "policy_change", version, "limiter: applied {summary}");
                self.note(true, summary.clone());
                Response::Applied(Applied { version, summary, upstream: None })
            }
            Err(e) => {
                let message = format!("{e}; policy v{version} keeps running");
                tracing::warn!(event = "policy_change", ok = false, version, "limiter: refused: {message}");
                self.note(false, message);
                e.answer(version)
            }
        }
    }

    /// SIGHUP's outcome (`source`: where the policy in force came from).
    pub(super) fn reloaded(&mut self, result: Result<String, ApplyError>, version: u64, source: &str) {
        match result {
            Ok(summary) => {
                tracing::info!(event = "reload", ok = true, version, source = %source, "limiter: SIGHUP: applied {source}: {summary}");
                self.note(true, summary);
            }
            Err(e) => {
                let message = format!("rejected: {e}; policy v{version} keeps running");
                tracing::warn!(event = "reload", ok = false, version, "limiter: SIGHUP: {message}");
                self.note(false, message);
            }
        }
    }

    /// The outcome of forgetting what reached its end (retried at the
    /// next tick when it failed).
    pub(super) fn expired(&mut self, result: Result<String, ApplyError>, version: u64) {
        match result {
            Ok(summary) => {
                tracing::info!(
                    event = "policy_change",
                    version,
                    "limiter: runtime override(s) expired: applied {summary}"
                );
                self.note(true, summary);
            }
            Err(e) => tracing::warn!("limiter: expiring runtime overrides failed (retried): {e}"),
        }
    }
}
