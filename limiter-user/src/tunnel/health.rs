//! The backends' health checks: one task per backend connects over TCP
//! each interval (with the check's timeout) and sends each result; the
//! feature counts them into rise and fall streaks once a second.

use std::{net::SocketAddr, time::Duration};

use tokio::{sync::mpsc, task::JoinHandle};

/// Results waiting for the feature's tick, at most (a tick drains them;
/// a full channel drops the newest, which the next interval repeats).
const ROOM: usize = 4096;

/// One result: the backend's global index, whether it connected, and
/// why not.
#[derive(Debug)]
pub struct Probe {
    pub index: u32,
    pub ok: bool,
    pub error: Option<String>,
}

/// The running checks; dropped, they stop.
#[derive(Debug)]
pub struct Checks {
    tasks: Vec<JoinHandle<()>>,
    pub results: mpsc::Receiver<Probe>,
}

impl Drop for Checks {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// Start a check of each `(index, addr)` every `interval`, each connect
/// given `timeout`.
#[must_use]
pub fn start(targets: Vec<(u32, SocketAddr, Duration, Duration)>) -> Checks {
    let (tx, results) = mpsc::channel(ROOM);
    let tasks = targets
        .into_iter()
        .map(|(index, addr, interval, timeout)| {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(interval);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    let (ok, error) = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                        Ok(Ok(_)) => (true, None),
                        Ok(Err(e)) => (false, Some(e.to_string())),
                        Err(_) => (false, Some(format!("no answer in {timeout:?}"))),
                    };
                    if tx.try_send(Probe { index, ok, error }).is_err() && tx.is_closed() {
                        return;
                    }
                }
            })
        })
        .collect();
    Checks { tasks, results }
}
