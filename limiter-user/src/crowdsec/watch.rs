//! Pulling the decision stream for as long as `[crowdsec]` stands: once
//! with `startup=true` (every decision in force), then the changes every
//! `update_frequency`. While the LAPI is down or slow the decisions in
//! force stay, pulls back off (1 s doubling to 60 s), and the status says
//! so; the bouncer key is read again before each pull, so a rotated key
//! is taken without a restart.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{sync::mpsc, task::JoinHandle};

use super::{Lapi, LapiError, Pull};
use crate::policy::crowdsec::Crowdsec;

/// The longest wait between two failed pulls.
pub const MAX_BACKOFF: Duration = Duration::from_mins(1);
/// Bytes a bouncer key file may hold.
const MAX_KEY: u64 = 4096;

/// One pull, for the policy state.
#[derive(Debug, Default)]
pub struct Pulled {
    pub startup: bool,
    pub pull: Pull,
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
    /// Start pulling (`startup=true` first), each pull sent to `tx`.
    #[must_use]
    pub fn start(spec: Crowdsec, tx: mpsc::Sender<Pulled>) -> Self {
        let status = Arc::new(Mutex::new(Status::default()));
        let task = tokio::spawn(run(spec.clone(), tx, status.clone()));
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

async fn run(spec: Crowdsec, tx: mpsc::Sender<Pulled>, status: Arc<Mutex<Status>>) {
    let mut startup = true;
    let mut backoff = Duration::from_secs(1);
    loop {
        let result = pull(&spec, startup).await;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
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
                if tx.send(Pulled { startup, pull }).await.is_err() {
                    return;
                }
                startup = false;
                backoff = Duration::from_secs(1);
                spec.update_frequency
            }
            Err(e) => {
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
