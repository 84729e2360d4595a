//! The forwarder to the tenant layer: what survives XDP is accepted on a
//! public address, shed at declared caps at accept time, and spliced to an
//! backend behind a PROXY protocol header carrying the client's address
//! and this limiter's verdict (`proxy`). `backend` keeps passive health
//! and balancing, `serve` the accept loop and the copy, and [`Manager`]
//! starts, replaces and drains forwarders as policies change; `feature`
//! is the daemon's face of it.

pub mod adaptive;
pub mod backend;
pub mod batch;
pub mod copy;
pub mod fds;
pub mod feature;
#[cfg(test)]
mod loopback;
pub mod proxy;
pub mod rank;
mod series;
pub mod serve;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use limiter_common::{BucketKey, BucketState, Config, gcra, mode, resolution, rules};
use tokio::sync::{Semaphore, watch};

pub use self::series::Reports;
use self::{backend::Backends, proxy::Verdict, serve::Shed};
use crate::{control::ForwardInfo as Report, policy::forward::Forward};

/// What a forwarder needs of the policy in force.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub version: u64,
    /// The kernel form of the policy (classes, prefix lengths).
    pub config: Config,
    /// Each connection's criticality.
    pub ranks: Arc<rank::Ranks>,
}

/// Counters of one forwarder, read at scrape time.
#[derive(Debug, Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    pub active: AtomicU64,
    pub completed: AtomicU64,
    pub shed: [AtomicU64; Shed::ALL.len()],
    /// (let in, shed at accept) by criticality (sheddable, default,
    /// critical).
    pub by_criticality: [[AtomicU64; 2]; 3],
    /// Connections closed because every backend failed.
    pub backend_failed: AtomicU64,
    pub backend_connect_failures: AtomicU64,
    /// Connections that could not reach a backend for a local reason
    /// (no descriptor, no buffer): never held against the backend.
    pub local_errors: AtomicU64,
    pub accept_errors: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
}

/// What the tasks of one forwarder share.
pub struct Shared {
    pub cfg: Forward,
    pub stats: Arc<Stats>,
    pub backends: Backends,
    pub slots: Arc<rank::Slots>,
    /// The descriptors every forwarder shares ([`fds`]).
    pub fds: Arc<Semaphore>,
    /// Adaptive throttling toward the backends (`None`: off).
    pub adaptive: Option<adaptive::Adaptive>,
    pub prefixes: serve::PrefixCounts,
    pub ctx: watch::Receiver<Arc<Context>>,
    pub buckets: Option<Arc<Mutex<BpfHashMap<MapData, BucketKey, BucketState>>>>,
    pub next_id: AtomicU64,
    /// Turned true when the drain timeout ran out: connections end.
    pub kill: watch::Sender<bool>,
    /// Warnings of failed backends, of local errors and of connections
    /// shed for want of descriptors, each said at most every few seconds
    /// with how many there were.
    pub(crate) warned: Mutex<[crate::listen::ErrorLog; 3]>,
}

/// A running forwarder.
struct Running {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    /// Its listening sockets, handed over to its successor on the same
    /// address when the policy changes (no rebind: no gap, no reset).
    listeners: Vec<(SocketAddr, Arc<tokio::net::TcpListener>)>,
    bind_errors: Vec<String>,
}

/// Every forwarder of the policy in force.
pub struct Manager {
    running: Vec<Running>,
    ctx: watch::Sender<Arc<Context>>,
    buckets: Option<Arc<Mutex<BpfHashMap<MapData, BucketKey, BucketState>>>>,
    /// Forwarders replaced or removed, still draining.
    draining: Vec<tokio::task::JoinHandle<()>>,
    fds: fds::Budget,
}

impl Manager {
    /// `buckets_map_id`: the bucket map, read for the allowance left;
    /// `fds`: the descriptors all forwarders share.
    #[must_use]
    pub fn new(buckets_map_id: u32, fds: fds::Budget) -> Self {
        let buckets = MapData::from_id(buckets_map_id)
            .ok()
            .and_then(|md| BpfHashMap::try_from(aya::maps::Map::LruHashMap(md)).ok())
            .map(|m| Arc::new(Mutex::new(m)));
        Self {
            running: Vec::new(),
            ctx: watch::Sender::new(Arc::new(Context::default())),
            buckets,
            draining: Vec::new(),
            fds,
        }
    }

    /// Run exactly `forwards` under `ctx`: unchanged ones keep running,
    /// changed and removed ones stop accepting and drain, new ones start.
    pub fn update(&mut self, forwards: &[Forward], ctx: Context) {
        self.ctx.send_replace(Arc::new(ctx));
        let (keep, gone): (Vec<Running>, Vec<Running>) =
            std::mem::take(&mut self.running).into_iter().partition(|r| forwards.contains(&r.shared.cfg));
        self.running = keep;
        let mut handed = HashMap::new();
        for mut r in gone {
            tracing::info!("limiter: forward {}: stops accepting, draining", r.shared.cfg.name);
            let _ = r.stop.send(true);
            handed.extend(r.listeners.drain(..));
            self.draining.push(tokio::spawn(drain(r)));
        }
        for f in forwards {
            if !self.running.iter().any(|r| &r.shared.cfg == f) {
                let r = self.start(f.clone(), &mut handed);
                self.running.push(r);
            }
        }
    }

    fn start(&self, cfg: Forward, handed: &mut HashMap<SocketAddr, Arc<tokio::net::TcpListener>>) -> Running {
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            backends: Backends::new(&cfg.backends, cfg.balance),
            slots: rank::Slots::new(&cfg),
            fds: Arc::clone(&self.fds.slots),
            adaptive: (cfg.adaptive_k.0 > 0.0).then(|| adaptive::Adaptive::new(cfg.adaptive_k.0, cfg.adaptive_window)),
            stats: Arc::new(Stats::default()),
            prefixes: Mutex::new(HashMap::new()),
            ctx: self.ctx.subscribe(),
            buckets: self.buckets.clone(),
            next_id: AtomicU64::new(1),
            kill: watch::Sender::new(false),
            warned: Mutex::default(),
            cfg,
        });
        let (mut listeners, mut bind_errors) = (Vec::new(), Vec::new());
        for addr in &shared.cfg.listen {
            match handed.remove(addr).map_or_else(|| bind(*addr).map(Arc::new), Ok) {
                Ok(l) => {
                    listeners.push((*addr, Arc::clone(&l)));
                    tokio::spawn(serve::accept_loop(l, Arc::clone(&shared), stop.subscribe()));
                }
                Err(e) => {
                    tracing::error!("limiter: forward {}: cannot listen on {addr}: {e}", shared.cfg.name);
                    bind_errors.push(format!("{addr}: {e}"));
                }
            }
        }
        let listening: Vec<SocketAddr> = listeners.iter().map(|(a, _)| *a).collect();
        tracing::info!(
            "limiter: forward {}: listening on {listening:?}, {} upstream(s), PROXY {:?}, at most {} connections (descriptors: limit {}, {} open at start, {} descriptors for all forwarders: {} such connections)",
            shared.cfg.name,
            shared.cfg.backends.len(),
            shared.cfg.proxy_protocol,
            shared.cfg.max_connections,
            self.fds.limit,
            self.fds.open,
            self.fds.total,
            self.fds.connections(shared.cfg.copy)
        );
        let (critical, default, sheddable) = shared.slots.limits();
        tracing::info!(
            "limiter: forward {}: at most {critical} connections open for critical ones, {default} for default ones, {sheddable} for sheddable ones",
            shared.cfg.name
        );
        let b = &self.fds;
        if shared.cfg.max_connections > b.connections(shared.cfg.copy) {
            tracing::warn!(
                "limiter: forward {}: max_connections {} needs {} descriptors ({} a connection), but the limit of {} ({} open at start, a reserve kept for the control socket, /metrics and feedback) leaves room for {} such connection(s) in all; past that, connections are shed (reason descriptors): raise LimitNOFILE",
                shared.cfg.name,
                shared.cfg.max_connections,
                shared.cfg.max_connections * fds::cost(shared.cfg.copy) as usize,
                fds::cost(shared.cfg.copy),
                b.limit,
                b.open,
                b.connections(shared.cfg.copy)
            );
        }
        Running { shared, stop, listeners, bind_errors }
    }

    /// Stop accepting everywhere and let connections finish, each
    /// forwarder up to its drain timeout.
    pub async fn drain_all(&mut self) {
        for r in std::mem::take(&mut self.running) {
            self.draining.push(tokio::spawn(drain(r)));
        }
        for h in std::mem::take(&mut self.draining) {
            let _ = h.await;
        }
    }

    /// Each forwarder's state.
    #[must_use]
    pub fn reports(&self) -> Vec<Report> {
        self.running.iter().map(report).collect()
    }

    /// The tenant layer rejected `rejected` connections of forwarder
    /// `name`: counted by its adaptive throttling. Its state after, or
    /// why not.
    pub fn load(&self, name: &str, rejected: u64) -> Result<crate::control::AdaptiveInfo, String> {
        let r =
            self.running.iter().find(|r| r.shared.cfg.name == name).ok_or_else(|| format!("no forwarder {name:?}"))?;
        let a = r.shared.adaptive.as_ref().ok_or_else(|| format!("forwarder {name:?} has adaptive throttling off"))?;
        let counted = a.rejected(rejected);
        report(r)
            .adaptive
            .map(|mut i| {
                i.counted = Some(counted);
                i
            })
            .ok_or_else(|| "no adaptive state".to_owned())
    }
}

/// The listening socket: address reuse, so a restarted daemon binds at
/// once; TCP_NODELAY, which its accepted sockets inherit.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let s = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    s.set_reuseaddr(true)?;
    // Accepted sockets inherit it: no setsockopt a connection.
    s.set_nodelay(true)?;
    s.bind(addr)?;
    // A bounded accept backlog: beyond it the kernel refuses.
    s.listen(1024)
}

async fn drain(r: Running) {
    let _ = r.stop.send(true);
    let deadline = Instant::now() + r.shared.cfg.drain_timeout;
    while r.shared.stats.active.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = r.shared.stats.active.load(Ordering::Relaxed);
    if left > 0 {
        tracing::warn!("limiter: forward {}: drain timeout; closing {left} connection(s)", r.shared.cfg.name);
        let _ = r.shared.kill.send(true);
    } else {
        tracing::info!("limiter: forward {}: drained", r.shared.cfg.name);
    }
}

fn report(r: &Running) -> Report {
    let s = &r.shared.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Report {
        name: r.shared.cfg.name.clone(),
        listening: r.listeners.iter().map(|(a, _)| a.to_string()).collect(),
        bind_errors: r.bind_errors.clone(),
        active: load(&s.active),
        accepted: load(&s.accepted),
        completed: load(&s.completed),
        shed: Shed::ALL.iter().map(|w| (w.label().to_owned(), s.shed_count(*w))).collect(),
        by_criticality: crate::policy::Criticality::ALL
            .iter()
            .map(|&c| {
                let [a, b] = &s.by_criticality[c as usize];
                (c.label().to_owned(), load(a), load(b))
            })
            .collect(),
        backend_failed: load(&s.backend_failed),
        backend_connect_failures: load(&s.backend_connect_failures),
        local_errors: load(&s.local_errors),
        backends: r.shared.backends.list.iter().map(|u| (u.addr.to_string(), u.up())).collect(),
        bytes_up: load(&s.bytes_up),
        bytes_down: load(&s.bytes_down),
        adaptive: r.shared.adaptive.as_ref().map(|a| {
            let (requests, accepts, refuse_probability) = a.state();
            crate::control::AdaptiveInfo {
                requests,
                accepts,
                refuse_probability,
                k: r.shared.cfg.adaptive_k.0,
                window_secs: r.shared.cfg.adaptive_window.as_secs(),
                counted: None,
            }
        }),
    }
}

/// This limiter's verdict on a connection let in as `a`: the
/// class its SYN was charged to, the prefix, and what is left of its
/// allowance, under the policy it was let in under.
fn verdict(f: &Shared, a: &serve::Admitted) -> Verdict {
    let ctx = &a.ctx;
    let cfg = &ctx.config;
    let (family, prefix) = a.prefix;
    let class = a.class;
    let key = rules::bucket_key(&a.syn, cfg.v4_prefix, cfg.v6_prefix, u8::try_from(class).unwrap_or(0));
    let limits = cfg.classes[class];
    Verdict {
        policy_version: ctx.version,
        class: u8::try_from(class).unwrap_or(0),
        shadow: limits.mode == mode::SHADOW,
        family: family.0,
        prefix_len: key.prefix_len,
        prefix,
        remaining: remaining(f, &key, &limits),
    }
}

/// Units left in `key`'s bucket now (a full bucket when there is none);
/// `u64::MAX` when an override decides (allow, or limits of its own) or
/// the class is a window quota (`limiter prefix show` tells its count).
fn remaining(f: &Shared, key: &BucketKey, limits: &limiter_common::ClassLimits) -> u64 {
    if limits.unit == 0 || limits.is_window() {
        return u64::MAX;
    }
    let burst = limits.tau / limits.unit;
    let Some(map) = &f.buckets else { return u64::MAX };
    let Ok(state) = map.lock().expect("not poisoned").get(key, 0) else { return burst };
    if state.resolved & u64::from(u32::MAX) != u64::from(resolution::CLASS) {
        return u64::MAX;
    }
    let now = gcra::to_fixed(crate::dataplane::maps::monotonic_coarse_ns());
    let debt = state.tat.saturating_sub(now);
    limits.tau.saturating_sub(debt) / limits.unit
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "current_thread")]
    async fn accepted_sockets_inherit_nodelay_from_the_listener() {
        let l = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(s.nodelay().unwrap(), "the accepted socket would delay small writes");
    }
}
