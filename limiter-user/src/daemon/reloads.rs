//! The outcomes of policy changes since start: logged, answered to the
//! client that asked, and kept for `status` and the metrics. A reload is
//! the policy file's (SIGHUP, `policy apply`): its health is what `last
//! reload` and `limiter_policy_reloads_total` say. An operator's request
//! the daemon refused (`prefix deny` of a network with host bits, `prefix
//! unset` of nothing) is no reload: it counts under its verb.

use std::time::Instant;

use crate::control::{Applied, ReloadInfo, Response};
use crate::engine::{ApplyError, changes::Change};
use crate::policy::OverrideAction;

/// The control verbs that change the policy state, whose refusals are
/// counted (`limiter_control_refused_total{verb}`).
pub(crate) const VERBS: [&str; 5] = ["prefix_set", "prefix_allow", "prefix_deny", "prefix_unset", "prefix_load"];

/// The verb that asked for `change`, by index in [`VERBS`] (none for a
/// file's, a source's or a penalty's).
fn verb(change: &Change) -> Option<usize> {
    let name = match change {
        Change::Prefix { action: Some(OverrideAction::Limit(_)), .. } => "prefix_set",
        Change::Prefix { action: Some(OverrideAction::Allow), .. } => "prefix_allow",
        Change::Prefix { action: Some(OverrideAction::Deny), .. } => "prefix_deny",
        Change::Prefix { action: None, .. } | Change::UnsetAll { .. } => "prefix_unset",
        Change::Load { .. } => "prefix_load",
        _ => return None,
    };
    VERBS.iter().position(|v| *v == name)
}

/// Policy file reloads since start, and the operator's refused requests,
/// for `status` and the metrics.
#[derive(Debug)]
pub(super) struct Reloads {
    pub(super) started: Instant,
    pub(super) last: Option<ReloadInfo>,
    pub(super) applied: u64,
    pub(super) rejected: u64,
    /// Unix times of the last applied and the last rejected policy.
    pub(super) last_applied: Option<u64>,
    pub(super) last_rejected: Option<u64>,
    /// Refused requests, by verb ([`VERBS`]).
    pub(super) refused: [u64; VERBS.len()],
}

impl Reloads {
    pub(super) fn new() -> Self {
        Self {
            started: Instant::now(),
            last: None,
            applied: 0,
            rejected: 0,
            last_applied: None,
            last_rejected: None,
            refused: [0; VERBS.len()],
        }
    }

    /// Record the outcome of a reload for `status` and the metrics.
    fn note(&mut self, ok: bool, message: String) {
        let now = crate::clock::unix_now();
        if ok {
            (self.applied, self.last_applied) = (self.applied + 1, Some(now));
        } else {
            (self.rejected, self.last_rejected) = (self.rejected + 1, Some(now));
        }
        self.last = Some(ReloadInfo { ok, message, unix_time: now });
    }

    /// A client's `change`: logged, recorded (a file's as a reload, an
    /// operator's refused request under its verb), and the answer to its
    /// client (`version`: the policy in force after it).
    pub(super) fn changed(&mut self, change: &Change, result: Result<String, ApplyError>, version: u64) -> Response {
        let file = matches!(change, Change::Apply { .. });
        match result {
            Ok(summary) => {
                tracing::info!(event = "policy_change", version, "limiter: applied {summary}");
                if file {
                    self.note(true, summary.clone());
                }
                Response::Applied(Applied { version, summary, upstream: None })
            }
            Err(e) => {
                let message = format!("{e}; policy v{version} keeps running");
                tracing::warn!(event = "policy_change", ok = false, version, "limiter: refused: {message}");
                if file {
                    self.note(false, message);
                } else if let Some(i) = verb(change) {
                    self.refused[i] += 1;
                }
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
    /// next tick when it failed; no reload either way).
    pub(super) fn expired(result: Result<String, ApplyError>, version: u64) {
        match result {
            Ok(summary) => {
                tracing::info!(
                    event = "policy_change",
                    version,
                    "limiter: runtime override(s) expired: applied {summary}"
                );
            }
            Err(e) => tracing::warn!("limiter: expiring runtime overrides failed (retried): {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_request_is_counted_under_its_verb_and_is_no_reload() {
        let mut r = Reloads::new();
        let net = "198.18.7.0/24".parse().unwrap();
        let deny =
            Change::Prefix { cidr: net, action: Some(OverrideAction::Deny), ttl: None, upstream: false, reason: None };
        let unset = Change::Prefix { cidr: net, action: None, ttl: None, upstream: false, reason: None };
        let refused = || Err(ApplyError::Request("no such override".into()));
        let _ = r.changed(&deny, Ok("v2".into()), 2);
        let _ = r.changed(&unset, refused(), 2);
        let _ = r.changed(&unset, refused(), 2);
        assert_eq!((r.applied, r.rejected, r.last.is_none()), (0, 0, true), "an operator's change is no reload");
        let at = |v: &str| r.refused[VERBS.iter().position(|x| *x == v).unwrap()];
        assert_eq!((at("prefix_unset"), at("prefix_deny")), (2, 0));
        // A policy file's, applied or refused, is.
        let apply = Change::Apply { name: "p.toml".into(), text: None, force: false };
        let _ = r.changed(&apply, refused(), 2);
        assert_eq!(r.rejected, 1);
        assert!(r.last.as_ref().is_some_and(|l| !l.ok));
        let _ = r.changed(&apply, Ok("v3".into()), 3);
        assert_eq!((r.applied, r.last.as_ref().map(|l| l.ok)), (1, Some(true)));
        assert_eq!(r.refused.iter().sum::<u64>(), 2, "a file's refusal is a reload's, not a verb's");
    }
}
