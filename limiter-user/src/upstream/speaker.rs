//! The thread that keeps the speaker's routes what the daemon wants: it
//! is handed the rules wanted, checks the speaker every
//! [`CHECK_EVERY`] (its sessions, and whether it still holds what was
//! announced: a restarted ExaBGP holds nothing, and is given everything
//! again, outside the change budget: putting back what the speaker lost
//! is no change at the transit), sends the difference within the change
//! budget, withdrawals first and the operator's before automation's
//! (which may use three quarters of the budget: the operator always
//! finds some left), and writes what is wanted and what is announced to the state
//! file before each announcement (so a daemon that dies leaves no route
//! it does not know of). Nothing here waits on the daemon's loop, and the
//! loop never waits on the speaker.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use super::state::Saved;
use super::{
    exabgp::{Pipe, PipeError, neighbours, routes},
    rule::{Key, Rule},
};
use crate::origin::Origin;

/// What the thread last found and did, as `limiter upstream list`,
/// `limiter status` and the metrics show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// The speaker answered its last check.
    pub speaker_up: bool,
    /// Each neighbour of the speaker and whether its session is up.
    pub neighbours: Vec<(String, bool)>,
    /// Rules the speaker holds for the daemon.
    pub announced: usize,
    /// Rules wanted and not yet sent (the change budget, the speaker down).
    pub pending: usize,
    pub announcements: u64,
    pub withdrawals: u64,
    /// Commands the speaker refused or did not answer.
    pub failures: u64,
    /// Times the speaker was found without what it had been given.
    pub reannounced: u64,
    pub last_error: Option<String>,
}

/// Between two checks of the speaker.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Between two reads of what the speaker holds (`show adj-rib out`, up
/// to 1.5 MB with 10,000 rules), unless it was just found back.
pub const RIB_EVERY: Duration = Duration::from_secs(5);
/// One command's deadline.
const DEADLINE: Duration = Duration::from_secs(2);

/// How the rules are sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sending {
    /// Log what would be sent; send nothing (and withdraw what is).
    pub shadow: bool,
    pub communities: Vec<String>,
    /// Announcements and withdrawals in any 60 s.
    pub max_changes_per_minute: u32,
}

enum Msg {
    Want(Vec<Rule>, Sending),
    Stop { withdraw: bool, done: mpsc::Sender<()> },
}

/// The daemon's side of the thread.
#[derive(Debug)]
pub struct Speaker {
    tx: mpsc::Sender<Msg>,
    status: Arc<Mutex<Status>>,
    thread: Option<JoinHandle<()>>,
}

impl Speaker {
    /// Start the thread for the speaker at `pipe`, keeping `state`; the
    /// speaker holds what `saved` says was announced as far as the daemon
    /// knows, and is to hold `wanted`.
    #[must_use]
    pub fn start(pipe: &Path, state: PathBuf, saved: Saved, wanted: Vec<Rule>, sending: Sending) -> Self {
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(Status::default()));
        let mut worker = Worker {
            pipe: Pipe::new(pipe),
            state,
            wanted: wanted.into_iter().map(|r| (r.key.clone(), r)).collect(),
            // Routes given with other communities than the policy's now
            // are given again.
            stale: if saved.communities == sending.communities {
                BTreeSet::new()
            } else {
                saved.announced.iter().map(|r| r.key.clone()).collect()
            },
            announced_with: saved.communities,
            announced: saved.announced.into_iter().map(|r| (r.key.clone(), r)).collect(),
            restoring: BTreeMap::new(),
            shadowed: BTreeMap::new(),
            sending,
            sent: VecDeque::new(),
            status: Arc::clone(&status),
            last_check: None,
            last_rib: None,
            dirty: true,
        };
        if worker.sending.shadow {
            worker.log_shadow();
        }
        let thread = std::thread::Builder::new()
            .name("limiter-upstream".into())
            .spawn(move || worker.run(&rx))
            .expect("a thread for the speaker");
        Self { tx, status, thread: Some(thread) }
    }

    /// Want `rules` announced (and nothing else), sent as `sending` says.
    pub fn want(&self, rules: Vec<Rule>, sending: Sending) {
        let _ = self.tx.send(Msg::Want(rules, sending));
    }

    #[must_use]
    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stop the thread (withdrawing everything first if `withdraw`),
    /// waiting at most `wait`.
    pub fn stop(mut self, withdraw: bool, wait: Duration) {
        let (done, finished) = mpsc::channel();
        if self.tx.send(Msg::Stop { withdraw, done }).is_ok()
            && finished.recv_timeout(wait).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

struct Worker {
    pipe: Pipe,
    state: PathBuf,
    wanted: BTreeMap<Key, Rule>,
    announced: BTreeMap<Key, Rule>,
    /// What a restarted speaker lost: given again without a charge to the
    /// change budget (the transit held them until the speaker went).
    restoring: BTreeMap<Key, Rule>,
    /// Announced routes that carry communities other than the policy's.
    stale: BTreeSet<Key>,
    /// The communities the announced routes carry (those not stale).
    announced_with: Vec<String>,
    /// What shadow mode would have announced.
    shadowed: BTreeMap<Key, Rule>,
    sending: Sending,
    /// When each change of the last minute was sent.
    sent: VecDeque<Instant>,
    status: Arc<Mutex<Status>>,
    last_check: Option<Instant>,
    /// When what the speaker holds was last read.
    last_rib: Option<Instant>,
    /// The state file is behind.
    dirty: bool,
}

/// The changes a minute automation may send of `max`: three quarters
/// (at least one), so the operator's change never waits a minute behind
/// link pressure's.
#[must_use]
pub fn automation_budget(max: usize) -> usize {
    (max * 3 / 4).max(1).min(max)
}

/// Whether two rules are the same route with the same action.
fn same(a: &Rule, b: &Rule) -> bool {
    a.key == b.key && a.action == b.action
}

impl Worker {
    fn run(mut self, rx: &mpsc::Receiver<Msg>) {
        loop {
            let mut msg = rx.recv_timeout(CHECK_EVERY);
            loop {
                match msg {
                    Ok(Msg::Want(rules, sending)) => {
                        if sending.communities != self.sending.communities {
                            self.stale = self.announced.keys().cloned().collect();
                        }
                        self.wanted = rules.into_iter().map(|r| (r.key.clone(), r)).collect();
                        self.sending = sending;
                        self.dirty = true;
                        if self.sending.shadow {
                            self.log_shadow();
                        } else {
                            self.shadowed.clear();
                        }
                    }
                    Ok(Msg::Stop { withdraw, done }) => {
                        if withdraw {
                            self.wanted.clear();
                            self.sending.shadow = false;
                            self.sync(true);
                        }
                        self.persist();
                        let _ = done.send(());
                        return;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                }
                msg = rx.try_recv().map_err(|e| match e {
                    mpsc::TryRecvError::Empty => mpsc::RecvTimeoutError::Timeout,
                    mpsc::TryRecvError::Disconnected => mpsc::RecvTimeoutError::Disconnected,
                });
            }
            if self.last_check.is_none_or(|t| t.elapsed() >= CHECK_EVERY) {
                self.check();
            }
            self.sync(false);
            self.persist();
        }
    }

    fn set(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    fn failed(&self, what: &str, e: &PipeError) {
        let line = format!("{what}: {e}");
        self.set(|s| {
            s.failures += 1;
            s.last_error = Some(line);
        });
    }

    /// Ask the speaker for its sessions and whether it still holds what
    /// it was given.
    fn check(&mut self) {
        self.last_check = Some(Instant::now());
        match self.pipe.ask("show neighbor summary", DEADLINE) {
            Ok(summary) => {
                let n = neighbours(&summary);
                let was_up = self.status.lock().is_ok_and(|s| s.speaker_up);
                if !was_up {
                    tracing::info!(event = "upstream", "limiter: upstream speaker answers ({} neighbour(s))", n.len());
                    // Back (or new): what it holds is read at once.
                    self.last_rib = None;
                }
                self.set(|s| {
                    s.speaker_up = true;
                    s.neighbours = n;
                });
            }
            Err(e) => {
                if self.status.lock().is_ok_and(|s| s.speaker_up) {
                    tracing::warn!(event = "upstream", "limiter: upstream speaker down: {e}; rules wait for it");
                }
                self.set(|s| {
                    s.speaker_up = false;
                    s.neighbours.clear();
                    s.last_error = Some(e.to_string());
                });
                return;
            }
        }
        if self.announced.is_empty() || self.last_rib.is_some_and(|t| t.elapsed() < RIB_EVERY) {
            return;
        }
        self.last_rib = Some(Instant::now());
        match self.pipe.ask("show adj-rib out", DEADLINE) {
            Ok(rib) if routes(&rib) < self.announced.len() => {
                let lost = self.announced.len() - routes(&rib);
                tracing::warn!(
                    event = "upstream",
                    "limiter: the upstream speaker holds {lost} fewer route(s) than it was given (restarted?): announcing all {} again",
                    self.announced.len()
                );
                self.restoring = std::mem::take(&mut self.announced);
                self.dirty = true;
                self.set(|s| s.reannounced += 1);
            }
            Ok(_) => {}
            Err(e) => self.failed("show adj-rib out", &e),
        }
    }

    /// A change of `by`'s rule may be sent now (`force`: a stop's
    /// withdrawals). Automation's may use [`automation_budget`] of the
    /// budget, the operator's all of it.
    fn budget(&mut self, force: bool, by: Origin) -> bool {
        let now = Instant::now();
        while self.sent.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_mins(1)) {
            self.sent.pop_front();
        }
        let max = self.sending.max_changes_per_minute as usize;
        let max = if by == Origin::Operator { max } else { automation_budget(max) };
        if !force && self.sent.len() >= max {
            return false;
        }
        self.sent.push_back(now);
        true
    }

    /// Send what differs between what is wanted and what is announced.
    fn sync(&mut self, force: bool) {
        let up = self.status.lock().is_ok_and(|s| s.speaker_up);
        let none = BTreeMap::new();
        let wanted = if self.sending.shadow { &none } else { &self.wanted };
        // A route still wanted with another action is announced again (it
        // replaces the old one), not withdrawn.
        let gone: Vec<Rule> = self.announced.values().filter(|r| !wanted.contains_key(&r.key)).cloned().collect();
        // What a restarted speaker lost and is no longer wanted: nothing
        // to withdraw.
        self.restoring.retain(|k, _| wanted.contains_key(k));
        let mut new: Vec<Rule> = wanted
            .values()
            .filter(|w| self.stale.contains(&w.key) || !self.announced.get(&w.key).is_some_and(|r| same(w, r)))
            .cloned()
            .collect();
        // The operator's first.
        new.sort_by_key(|r| r.by);
        let mut pending = 0;
        if up || force {
            let c = self.sending.communities.clone();
            for r in gone {
                if !self.budget(force, r.by) {
                    pending += 1;
                    continue;
                }
                match self.pipe.ask(&r.withdraw(&c), DEADLINE) {
                    Ok(_) => {
                        tracing::info!(event = "upstream", "limiter: withdrew upstream {}", r.describe());
                        self.announced.remove(&r.key);
                        self.stale.remove(&r.key);
                        self.dirty = true;
                        self.set(|s| s.withdrawals += 1);
                    }
                    Err(e) => self.failed(&format!("withdrawing {}", r.describe()), &e),
                }
            }
            // What the budget lets go now, written down first, in one
            // write: a daemon that dies while it goes withdraws it when it
            // starts again.
            let total = new.len();
            let sending: Vec<Rule> = new
                .into_iter()
                .filter(|r| {
                    let restore = self.restoring.get(&r.key).is_some_and(|o| same(o, r));
                    !force && (restore || self.budget(false, r.by))
                })
                .collect();
            pending += total - sending.len();
            for r in &sending {
                self.restoring.remove(&r.key);
                self.announced.insert(r.key.clone(), r.clone());
            }
            if !sending.is_empty() {
                self.dirty = true;
                self.persist();
            }
            for r in sending {
                match self.pipe.ask(&r.announce(&c), DEADLINE) {
                    Ok(_) => {
                        tracing::info!(event = "upstream", "limiter: announced upstream {}", r.describe());
                        if self.stale.remove(&r.key) {
                            // The file says which communities they carry.
                            self.dirty = true;
                        }
                        self.set(|s| s.announcements += 1);
                    }
                    Err(e) => {
                        self.failed(&format!("announcing {}", r.describe()), &e);
                        if matches!(e, PipeError::Refused) {
                            self.announced.remove(&r.key);
                        }
                    }
                }
            }
        } else {
            pending = gone.len() + new.len();
        }
        let announced = self.announced.len();
        self.set(|s| {
            s.pending = pending;
            s.announced = announced;
        });
    }

    /// In shadow mode: log each rule that would be announced or withdrawn.
    fn log_shadow(&mut self) {
        for r in self.wanted.values() {
            if !self.shadowed.get(&r.key).is_some_and(|s| same(s, r)) {
                tracing::info!(
                    event = "upstream",
                    shadow = true,
                    "limiter: shadow: would announce upstream {}",
                    r.describe()
                );
            }
        }
        for r in self.shadowed.values() {
            if !self.wanted.contains_key(&r.key) {
                tracing::info!(
                    event = "upstream",
                    shadow = true,
                    "limiter: shadow: would withdraw upstream {}",
                    r.describe()
                );
            }
        }
        self.shadowed.clone_from(&self.wanted);
    }

    fn persist(&mut self) {
        if !self.dirty {
            return;
        }
        if self.stale.is_empty() {
            self.announced_with.clone_from(&self.sending.communities);
        }
        let saved = Saved {
            wanted: self.wanted.values().cloned().collect(),
            announced: self.announced.values().cloned().collect(),
            communities: self.announced_with.clone(),
        };
        match saved.write(&self.state) {
            Ok(()) => self.dirty = false,
            Err(e) => {
                let line = format!("writing {}: {e}", self.state.display());
                tracing::warn!(event = "upstream", "limiter: upstream state: {line}");
                self.set(|s| s.last_error = Some(line));
            }
        }
    }
}
