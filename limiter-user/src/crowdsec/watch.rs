//! Pulling the decision stream for as long as `[crowdsec]` stands: once
//! with `startup=true` (every decision in force), then the changes every
//! `update_frequency`, and every decision again every [`FULL_EVERY`]
//! pulls (what a delta lost comes back). While the LAPI is down or slow
//! the decisions in force stay, pulls back off (1 s doubling to 60 s), and
//! the status says so; the bouncer key is read again before each pull, so
//! a rotated key is taken without a restart.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    task::JoinHandle,
};

use super::{Lapi, LapiError, Pull};
use crate::policy::crowdsec::Crowdsec;

/// `v` in pieces of at most `size`, in order, moved (each piece cut off
/// the tail: nothing is copied twice).
fn split<T>(mut v: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    while v.len() > size {
        let at = (v.len() - 1) / size * size;
        out.push(v.split_off(at));
    }
    if !v.is_empty() {
        out.push(v);
    }
    out.reverse();
    out
}

/// Pulls from one `startup=true` pull to the next. The LAPI answers a
/// delta pull with the decisions made since the pull before, and a bulk
/// insert's chunk stamped before a pull but committed after it is in
/// neither (seen: 50 of 10,000 imported decisions, one chunk of the 50
/// the LAPI writes at a time, never came); a startup pull, every
/// decision in force, brings back what a delta lost: within ten minutes
/// at the default `update_frequency`.
pub const FULL_EVERY: u64 = 60;

/// After a pull that succeeded (a startup pull or not) with `since_full`
/// pulls since the last startup pull before it: whether the next is a
/// startup pull, and the pulls since the last one then.
fn after_pull(startup: bool, since_full: u64) -> (bool, u64) {
    let since = if startup { 1 } else { since_full + 1 };
    (since >= FULL_EVERY, since)
}

/// The longest wait between two failed pulls.
pub const MAX_BACKOFF: Duration = Duration::from_mins(1);
/// Bytes a bouncer key file may hold.
const MAX_KEY: u64 = 4096;

/// One pull, or a part of one, for the policy state.
#[derive(Debug, Default)]
pub struct Pulled {
    pub startup: bool,
    pub pull: Pull,
    pub part: Part,
    /// The pull's room among the [`ROOM`] a watch may have decoded at
    /// once, shared by its parts: free again when the last is dropped
    /// (applied, or left as stale).
    pub room: Option<Arc<OwnedSemaphorePermit>>,
}

/// Pulls a watch may hold decoded at once: one being applied and one
/// waiting (a LAPI answering 850,000 decisions at every pull never piles
/// them up).
pub const ROOM: usize = 2;

/// Where a part lies in its pull: a pull is applied in parts of at most
/// [`PART`] decisions, each a change of its own, so that the operator's
/// changes never wait behind a whole big pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub first: bool,
    pub last: bool,
    /// New decisions in the whole pull (room is made for them at its first part).
    pub of: usize,
}

impl Default for Part {
    /// A whole pull.
    fn default() -> Self {
        Self { first: true, last: true, of: 0 }
    }
}

/// Decisions in one part of a pull.
pub const PART: usize = 2_000;

impl Pulled {
    /// This pull in parts of at most `size` decisions (deletions first,
    /// as a pull is applied), the first and the last marked; the counts
    /// of what was left out ride on the last.
    #[must_use]
    pub fn parts(self, size: usize) -> Vec<Pulled> {
        let Pulled { startup, pull, room, .. } = self;
        let size = size.max(1);
        let Pull { new, deleted, other_scope, bad_value, bad_duration } = pull;
        let of = new.len();
        let mut parts: Vec<Pull> = Vec::new();
        for chunk in split(deleted, size) {
            parts.push(Pull { deleted: chunk, ..Pull::default() });
        }
        for chunk in split(new, size) {
            parts.push(Pull { new: chunk, ..Pull::default() });
        }
        if parts.is_empty() {
            parts.push(Pull::default());
        }
        if let Some(last) = parts.last_mut() {
            (last.other_scope, last.bad_value, last.bad_duration) = (other_scope, bad_value, bad_duration);
        }
        let n = parts.len();
        parts
            .into_iter()
            .enumerate()
            .map(|(i, pull)| Pulled {
                startup,
                pull,
                part: Part { first: i == 0, last: i + 1 == n, of },
                room: room.clone(),
            })
            .collect()
    }
}

/// What the pulls have been.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The last pull succeeded.
    pub up: bool,
    pub pulls: u64,
    pub failures: u64,
    /// Failed pulls since the last that succeeded.
    pub failing: u64,
    /// Unix time of the last pull that succeeded (0: none yet).
    pub last_ok: u64,
    pub last_error: Option<String>,
    /// Decisions the stream brought, new and deleted, since the start.
    pub new: u64,
    pub deleted: u64,
}

/// The pulling task.
#[derive(Debug)]
pub struct Watch {
    task: JoinHandle<()>,
    pub spec: Crowdsec,
    pub status: Arc<Mutex<Status>>,
}

impl Watch {
    /// Start pulling (`startup=true` first), each pull sent to `tx` as
    /// `wrap` makes it.
    #[must_use]
    pub fn start<T: Send + 'static>(
        spec: Crowdsec,
        tx: mpsc::Sender<T>,
        wrap: impl Fn(Pulled) -> T + Send + 'static,
    ) -> Self {
        let status = Arc::new(Mutex::new(Status::default()));
        let task = tokio::spawn(run(spec.clone(), tx, wrap, status.clone()));
        Self { task, spec, status }
    }

    /// The status now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run<T>(spec: Crowdsec, tx: mpsc::Sender<T>, wrap: impl Fn(Pulled) -> T, status: Arc<Mutex<Status>>) {
    let (mut startup, mut since_full) = (true, 0u64);
    let mut backoff = Duration::from_secs(1);
    let rooms = Arc::new(Semaphore::new(ROOM));
    loop {
        // Room for the pull before it is made, taken back when its last
        // part is applied: at most one waits decoded beside the one
        // being applied.
        let Ok(room) = Arc::clone(&rooms).acquire_owned().await else { return };
        let result = pull(&spec, startup).await;
        let now = crate::clock::unix_now();
        let wait = match result {
            Ok(pull) => {
                let failed = {
                    let mut s = status.lock().unwrap_or_else(PoisonError::into_inner);
                    let failed = s.failing;
                    s.up = true;
                    s.pulls += 1;
                    s.failing = 0;
                    s.last_ok = now;
                    s.last_error = None;
                    s.new += pull.new.len() as u64;
                    s.deleted += pull.deleted.len() as u64;
                    failed
                };
                if failed > 0 {
                    tracing::info!(
                        event = "crowdsec",
                        ok = true,
                        "limiter: crowdsec: the LAPI at {} answers again after {failed} failed pull(s)",
                        spec.lapi_url
                    );
                }
                let pulled = Pulled { startup, pull, part: Part::default(), room: Some(Arc::new(room)) };
                if tx.send(wrap(pulled)).await.is_err() {
                    return;
                }
                (startup, since_full) = after_pull(startup, since_full);
                backoff = Duration::from_secs(1);
                spec.update_frequency
            }
            Err(e) => {
                drop(room);
                let first = {
                    let mut s = status.lock().unwrap_or_else(PoisonError::into_inner);
                    s.up = false;
                    s.failures += 1;
                    s.failing += 1;
                    s.last_error = Some(e.to_string());
                    s.failing == 1
                };
                if first {
                    tracing::warn!(
                        event = "crowdsec",
                        ok = false,
                        "limiter: crowdsec: {e}; the decisions in force stay; retrying, backing off to {} s",
                        MAX_BACKOFF.as_secs()
                    );
                }
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Read the key, then pull.
async fn pull(spec: &Crowdsec, startup: bool) -> Result<Pull, LapiError> {
    let path = spec.api_key_file.clone();
    let key = tokio::task::spawn_blocking(move || crate::policy::file::read_text(&path, MAX_KEY, "a bouncer key"))
        .await
        .map_err(|e| LapiError::Http(e.to_string()))?
        .map_err(|e| LapiError::KeyFile(e.to_string()))?;
    Lapi::new(&spec.lapi_url, key.trim())?.pull(startup).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first pull and then one in every [`FULL_EVERY`] are startup
    /// pulls.
    #[test]
    fn one_pull_in_full_every_is_a_startup_pull() {
        let (mut startup, mut since) = (true, 0);
        let mut full = Vec::new();
        for i in 0..=3 * FULL_EVERY {
            if startup {
                full.push(i);
            }
            (startup, since) = after_pull(startup, since);
        }
        assert_eq!(full, [0, FULL_EVERY, 2 * FULL_EVERY, 3 * FULL_EVERY]);
    }
}
