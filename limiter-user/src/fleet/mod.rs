//! Fleet-wide window quotas: every `sync_interval` this node pushes the
//! local counts of the fleet-scope prefixes that had packets since the
//! last sync and pulls the fleet's totals for them, and writes the other
//! nodes' share into the program's `FLEET` map, so XDP admits while
//! `others + local` stays within the limit (delayed synchronization).
//!
//! It runs on a thread of its own (map syscalls and the store's round
//! trips never hold up the daemon's loop). When the store is down, slow
//! or partitioned, nothing is refused because of it: the program decides
//! on the last view plus local counts (`on_store_failure = "open"`), or
//! on `limit / nodes` (`"split"`); the sync retries with back-off and
//! pushes what accumulated once the store is back.

mod classes;
pub mod feature;
pub mod ledger;
mod peers;
mod plan;
mod readers;
mod series;
pub mod share;
mod status;
pub mod store;

pub use self::{
    classes::{ClassWindow, Classes},
    peers::{Peer, offset, peers_of, remember, shift, skewed},
    readers::Readers,
    status::{FleetStatus, SyncError},
};

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use limiter_common::{
    BucketKey,
    window::{self, FleetSlot, Touch},
};
use redis::RedisError;
use tokio::sync::watch;

use self::{
    ledger::Ledger,
    status::SyncedRound,
    store::{Push, Store},
};
use crate::{dataplane::maps::WindowMaps, policy::fleet::Fleet};

/// Most prefixes pushed in one sync; the rest wait for the next.
pub const MAX_PUSH: usize = 50_000;
/// Sync latencies kept for `fleet status` (a median, not a history).
pub const RECENT: usize = 128;
/// Longest wait between attempts while the store is down.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Wall-clock Unix ns and its offset from the program's clock
/// (`CLOCK_MONOTONIC`).
#[must_use]
pub fn wall_and_offset() -> (u64, u64) {
    let read = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime fills the struct we own.
        unsafe { libc::clock_gettime(clock, &raw mut ts) };
        u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
    };
    let mono = read(libc::CLOCK_MONOTONIC);
    let wall = read(libc::CLOCK_REALTIME);
    (wall, wall.wrapping_sub(mono))
}

/// A running fleet sync.
pub struct FleetSync {
    pub status: Arc<Mutex<FleetStatus>>,
    classes: watch::Sender<Classes>,
    /// `None`: stop.
    config: watch::Sender<Option<Fleet>>,
    /// The sync's thread; it hands the maps back when it stops.
    thread: Option<std::thread::JoinHandle<Box<WindowMaps>>>,
}

impl FleetSync {
    /// Start syncing on a thread of its own.
    pub fn spawn(cfg: Fleet, maps: Box<WindowMaps>, classes: Classes) -> std::io::Result<Self> {
        let status = Arc::new(Mutex::new(FleetStatus {
            node: cfg.node.clone(),
            store: cfg.store.iter().map(|a| crate::policy::fleet::redacted(a)).collect(),
            cluster: cfg.is_cluster(),
            sync_interval_ms: u64::try_from(cfg.sync_interval.as_millis()).unwrap_or(u64::MAX),
            ..FleetStatus::default()
        }));
        let (tx, rx) = watch::channel(classes);
        let (config, config_rx) = watch::channel(Some(cfg.clone()));
        let out = Arc::clone(&status);
        let thread = std::thread::Builder::new().name("fleet-sync".into()).spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
            let sync = Sync {
                cfg,
                config: config_rx,
                maps,
                classes: rx,
                ledger: Ledger::default(),
                status: out,
                store: None,
                peers: Vec::new(),
                remembered: Vec::new(),
                offset_ms: 0,
                skewed: Vec::new(),
            };
            rt.block_on(sync.run())
        })?;
        Ok(Self { status, classes: tx, config, thread: Some(thread) })
    }

    /// The policy has no `[fleet]` any more: stop after the sync in flight
    /// (if any), forget the other nodes' counts (fleet-scope quotas then
    /// count this host only) and hand the maps back ([`Self::stopped`]).
    pub fn stop(&self) {
        self.config.send_replace(None);
    }

    /// `None` while the sync is still winding down; once it has stopped,
    /// the maps it hands back (`Some(None)`: its thread died without them).
    pub fn stopped(&mut self) -> Option<Option<Box<WindowMaps>>> {
        if !self.thread.as_ref().is_none_or(std::thread::JoinHandle::is_finished) {
            return None;
        }
        Some(self.thread.take().and_then(|t| t.join().ok()))
    }

    /// The policy changed: sync its classes from now on.
    pub fn set_classes(&self, classes: Classes) {
        self.classes.send_replace(classes);
    }

    /// The policy's `[fleet]` changed: from the next sync on, use it (a
    /// changed store is connected to afresh; what this node counted and has
    /// not pushed yet goes to the new one).
    pub fn set_config(&self, cfg: Fleet) {
        self.config.send_replace(Some(cfg));
    }

    #[must_use]
    pub fn status(&self) -> FleetStatus {
        self.status.lock().expect("not poisoned").clone()
    }
}

struct Sync {
    cfg: Fleet,
    /// A new `[fleet]` from a policy apply (`None`: stop).
    config: watch::Receiver<Option<Fleet>>,
    maps: Box<WindowMaps>,
    classes: watch::Receiver<Classes>,
    ledger: Ledger,
    status: Arc<Mutex<FleetStatus>>,
    store: Option<Store>,
    /// The peers whose counts are read (from the last heartbeats read).
    peers: Vec<Peer>,
    /// Every peer seen fresh, most recent first (at most
    /// `store::MAX_PEERS`): their heartbeats are asked for by name, so a
    /// peer that went stale for a while (stopped, or the store blocked
    /// longer than the freshness allows) is found again when it beats,
    /// even when a huge heartbeat hash hides it from the one page scanned.
    remembered: Vec<String>,
    /// This node's clock's offset from the store's, in ms.
    offset_ms: i64,
    /// Nodes reported as skewed (logged once per episode).
    skewed: Vec<String>,
}

impl Sync {
    /// Sync until told to stop; then the maps go back to the daemon.
    async fn run(mut self) -> Box<WindowMaps> {
        let mut every = u64::try_from(self.cfg.sync_interval.as_nanos()).unwrap_or(u64::MAX).max(1);
        let (mut epoch, mut n) = (1u64, 0u64);
        let mut backoff = Duration::ZERO;
        let mut next_try = Instant::now();
        // Heartbeats are read back every 2 s (and on the first syncs).
        let mut nodes_read: Option<Instant> = None;
        loop {
            if self.config.has_changed().unwrap_or(false) {
                let Some(cfg) = self.config.borrow_and_update().clone() else { return self.wind_down() };
                self.reconfigure(cfg);
                every = u64::try_from(self.cfg.sync_interval.as_nanos()).unwrap_or(u64::MAX).max(1);
                (n, backoff, next_try, nodes_read) = (0, Duration::ZERO, Instant::now(), None);
            }
            // Every node syncs on the same wall-clock ticks (multiples of
            // the interval), so the views they pull are of the same moment.
            let now = wall_and_offset().0;
            let tick = tokio::time::sleep(Duration::from_nanos(every - now % every));
            tokio::select! {
                () = tick => {}
                changed = self.config.changed() => {
                    // Gone: the daemon is exiting; the maps (pinned or
                    // not) keep the last view for the program.
                    if changed.is_err() {
                        return self.maps;
                    }
                    // Seen at the top of the loop.
                    self.config.mark_changed();
                    continue;
                }
            }
            let (wall, offset) = wall_and_offset();
            epoch += 1;
            let _ = self.maps.state.set(FleetSlot::WallOffset.index(), offset, 0);
            let _ = self.maps.state.set(FleetSlot::Epoch.index(), epoch, 0);
            while let Some(item) = self.maps.touched.next() {
                if item.len() >= size_of::<Touch>() {
                    // SAFETY: the program writes whole Touch records; read unaligned.
                    let t = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Touch>()) };
                    self.ledger.touched(t.key);
                }
            }
            if Instant::now() < next_try {
                self.publish(|_| {});
                continue;
            }
            n += 1;
            let read_nodes = n <= 3 || nodes_read.is_none_or(|t| t.elapsed() >= Duration::from_secs(2));
            match self.sync(wall, wall / every, read_nodes).await {
                Ok(()) => {
                    if read_nodes {
                        nodes_read = Some(Instant::now());
                    }
                    backoff = Duration::ZERO;
                    if n % 50 == 0 {
                        let classes = self.classes.borrow().clone();
                        let now_ns = wall_and_offset().0;
                        self.ledger.sweep(|k| {
                            let c = classes.of(k)?;
                            Some((now_ns / c.slice_ns, c.slices))
                        });
                    }
                }
                Err(e) => {
                    backoff = (backoff * 2).clamp(self.cfg.sync_interval, MAX_BACKOFF);
                    next_try = Instant::now() + backoff;
                    self.failed(&e, wall);
                }
            }
        }
    }

    /// Stop: the other nodes' counts are forgotten (without `[fleet]`
    /// fleet-scope quotas count this host only, and a view that no longer
    /// refreshes must not refuse anyone), a split for an outage is lifted.
    fn wind_down(mut self) -> Box<WindowMaps> {
        let keys: Vec<BucketKey> = self.maps.fleet.keys().filter_map(Result::ok).collect();
        for k in &keys {
            let _ = self.maps.fleet.remove(k);
        }
        let _ = self.maps.state.set(FleetSlot::Split.index(), 0, 0);
        tracing::info!(
            event = "fleet_sync",
            stopped = true,
            "limiter: fleet sync with {} stopped (the policy has no [fleet] section); forgot the other nodes' counts of {} prefixes: fleet-scope quotas count this host only",
            self.cfg.store.join(", "),
            keys.len()
        );
        self.maps
    }

    /// Take a new `[fleet]`: another store is connected to at the next
    /// sync; the status names the new settings.
    fn reconfigure(&mut self, cfg: Fleet) {
        if cfg.store != self.cfg.store {
            self.store = None;
        }
        let mut st = self.status.lock().expect("not poisoned");
        st.node.clone_from(&cfg.node);
        st.store = cfg.store.iter().map(|a| crate::policy::fleet::redacted(a)).collect();
        st.cluster = cfg.is_cluster();
        st.sync_interval_ms = u64::try_from(cfg.sync_interval.as_millis()).unwrap_or(u64::MAX);
        st.nodes_seen.clear();
        drop(st);
        self.cfg = cfg;
    }

    /// One sync: push, pull, write the others' counts.
    async fn sync(&mut self, wall_ns: u64, round: u64, read_nodes: bool) -> Result<(), RedisError> {
        if self.store.is_none() {
            let s = tokio::time::timeout(self.cfg.timeout, Store::connect(&self.cfg))
                .await
                .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
            self.store = Some(s);
        }
        let batch = self.plan(wall_ns);
        let pushes: Vec<Push> = batch.iter().map(|b| b.push.clone()).collect();
        let started = Instant::now();
        let store = self.store.as_mut().expect("connected above");
        let barrier = (self.cfg.nodes > 1).then(|| store::Barrier {
            round,
            nodes: self.cfg.nodes,
            wait: (self.cfg.sync_interval / 4).min(Duration::from_millis(100)),
        });
        let sent_ms = wall_ns / 1_000_000;
        let known = read_nodes.then_some(self.remembered.as_slice());
        let exchange = store.exchange(&pushes, &self.cfg.node, sent_ms, known, barrier);
        let got = match tokio::time::timeout(self.cfg.timeout, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))),
        };
        let latency = started.elapsed();
        // The store took the heartbeat about half the round trip after it
        // left: this node's clock's offset from the store's.
        let half = u64::try_from(latency.as_millis() / 2).unwrap_or(0);
        self.offset_ms = offset(sent_ms + half, got.store_ms);
        for (b, values) in batch.iter().zip(&got.windows) {
            self.ledger.pushed(b.key, b.local);
            let others = share::view(&b.reads, values, &b.local, b.at, b.limit);
            let (cur, n) = (b.at.cur, b.at.slices);
            let fleet = window::total(&others, cur, 0, n) + window::total(&b.local, cur, 0, n);
            self.ledger.heat(b.key, fleet, b.limit);
            let _ = self.maps.fleet.insert(b.key, others, 0);
        }
        let _ = self.maps.state.set(FleetSlot::Split.index(), 0, 0);
        let mut nodes = None;
        if let Some(beats) = &got.beats {
            let fresh =
                u64::try_from(self.cfg.sync_interval.as_millis()).unwrap_or(u64::MAX).saturating_mul(10).max(5_000);
            self.peers = peers_of(&beats.nodes, &self.cfg.node, got.store_ms, fresh);
            remember(&mut self.remembered, &self.peers);
            let mut seen: Vec<String> = self.peers.iter().map(|p| p.name.clone()).collect();
            seen.push(self.cfg.node.clone());
            nodes = Some((seen, beats.fields));
            self.report_skew();
        }
        let commands: usize = pushes.iter().map(Push::commands).sum::<usize>() + 1 + 3 * usize::from(read_nodes);
        let bytes: usize = pushes.iter().map(|p| p.pipeline().get_packed_pipeline().len()).sum();
        let round = SyncedRound { wall_ns, latency, pushed: pushes.len(), commands, bytes, nodes };
        let offset_ms = self.offset_ms;
        self.publish(|s| {
            s.clock_offset_ms = offset_ms;
            s.synced(round);
        });
        Ok(())
    }

    /// Say which nodes (this one included) are more than one slice of the
    /// finest fleet class off the store's clock: in the status, and in a
    /// log line when a node becomes skewed. Their slices are read on this
    /// node's clock (see [`shift`]), so their counts still land in the
    /// right slices.
    fn report_skew(&mut self) {
        let slice_ms = self.classes.borrow().finest_fleet_slice_ns().map_or(u64::MAX, |ns| ns / 1_000_000).max(1);
        let skewed = peers::skewed(&self.peers, &self.cfg.node, self.offset_ms, slice_ms);
        for (n, o) in &skewed {
            if !self.skewed.contains(n) {
                tracing::warn!(
                    event = "fleet_clock",
                    node = %n,
                    offset_ms = o,
                    "limiter: fleet node {n}'s clock is {o} ms off the store's (more than one {slice_ms} ms slice): its slices are read on this node's clock; fix its time (NTP)"
                );
            }
        }
        self.skewed = skewed.iter().map(|(n, _)| n.clone()).collect();
        self.publish(|s| s.skewed = skewed);
    }

    /// A sync failed: the store counts as down until one succeeds.
    fn failed(&mut self, e: &RedisError, wall_ns: u64) {
        let kind = SyncError::of(e);
        let _ = self.maps.state.set(FleetSlot::Split.index(), u64::from(self.cfg.nodes), 0);
        if matches!(self.store, Some(Store::Cluster(_))) && kind != SyncError::Server {
            self.store = None;
        }
        self.publish(|s| {
            s.errors.bump(kind);
            if s.store_up || s.down_since_unix_ms.is_none() {
                s.store_up = false;
                s.outages += 1;
                s.down_since_unix_ms = Some(wall_ns / 1_000_000);
                let why = kind.remedy(e);
                tracing::warn!(event = "fleet_store", up = false, kind = kind.label(), "limiter: fleet store {} unreachable ({why}); deciding on the last view plus local counts (split classes: limit / nodes) until it is back", s.store.join(","));
            }
        });
    }

    fn publish(&self, f: impl FnOnce(&mut FleetStatus)) {
        let mut s = self.status.lock().expect("not poisoned");
        s.pending = self.ledger.pending_len();
        s.hot = self.ledger.hot_len();
        s.remembered = self.ledger.remembered();
        s.dropped = self.ledger.dropped;
        f(&mut s);
    }
}
