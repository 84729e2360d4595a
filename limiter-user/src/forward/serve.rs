//! One listening address of a forwarder: accept, shed at the caps at once
//! (never queued), connect a backend (another if it fails), send the
//! PROXY header, and copy both ways with bounded buffers, half-close and
//! an idle timeout.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, watch},
};

use super::{
    Context, Shared, Stats,
    copy::{Activity, pump},
    proxy,
};
use crate::policy::{Criticality, forward::ProxyProtocol};

/// Why a connection was closed at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    MaxConnections,
    MaxPerPrefix,
    NoBackend,
    /// The descriptors the forwarders may hold are all held ([`super::fds`]).
    Descriptors,
    /// Adaptive throttling: the backends accept too few ([`super::adaptive`]).
    Adaptive,
}

impl Shed {
    pub const ALL: [Shed; 5] =
        [Shed::MaxConnections, Shed::MaxPerPrefix, Shed::NoBackend, Shed::Descriptors, Shed::Adaptive];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Shed::MaxConnections => "max_connections",
            Shed::MaxPerPrefix => "max_connections_per_prefix",
            Shed::NoBackend => "no_upstream",
            Shed::Descriptors => "descriptors",
            Shed::Adaptive => "adaptive",
        }
    }
}

/// A source prefix: family and masked address.
pub type PrefixKey = (limiter_common::Family, [u8; 16]);
/// Connections open per source prefix.
pub type PrefixCounts = Mutex<HashMap<PrefixKey, usize>>;

/// Accept on `listener` until `stop` turns true.
pub async fn accept_loop(listener: Arc<TcpListener>, f: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    use crate::listen::{BACKOFF, ErrorLog};
    // Every connection's local port is the listener's (for its class),
    // and its local address too when the listener is bound to one (no
    // getsockname a connection then).
    let bound = listener.local_addr().ok();
    let port = bound.map_or(0, |a| a.port());
    let local = bound.filter(|a| !a.ip().is_unspecified());
    let (mut backoff, mut errors) = (BACKOFF.0, ErrorLog::default());
    super::batch::start();
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                f.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                errors.note(|n| {
                    tracing::warn!("limiter: forward {}: accept failed ({n} times since last said): {e}", f.cfg.name);
                });
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
                continue;
            }
        };
        backoff = BACKOFF.0;
        f.stats.accepted.fetch_add(1, Ordering::Relaxed);
        match admit(&f, peer, port) {
            Ok(a) => {
                f.stats.by_criticality[a.criticality as usize][0].fetch_add(1, Ordering::Relaxed);
                let f = Arc::clone(&f);
                tokio::spawn(async move {
                    f.stats.active.fetch_add(1, Ordering::Relaxed);
                    serve(stream, peer, local, &a, &f).await;
                    f.stats.active.fetch_sub(1, Ordering::Relaxed);
                    release(&f.prefixes, a.counted.then_some(a.prefix));
                    drop((a.slot, a.fds));
                });
            }
            Err((why, criticality)) => {
                // Closed at once: an RST-free close, before any work.
                drop(stream);
                f.stats.shed[why as usize].fetch_add(1, Ordering::Relaxed);
                f.stats.by_criticality[criticality as usize][1].fetch_add(1, Ordering::Relaxed);
                if why == Shed::Descriptors {
                    f.warned.lock().expect("not poisoned")[2].note(|n| {
                        tracing::warn!(
                            "limiter: forward {}: {n} connection(s) shed: the forwarders hold every descriptor they may (a reserve is kept for the control socket); raise LimitNOFILE",
                            f.cfg.name
                        );
                    });
                }
            }
        }
    }
}

/// A connection let in: its global slot, the policy it was let in under
/// and its source prefix by that policy (computed once, for the
/// per-prefix cap and the PROXY v2 verdict alike), and whether it is
/// counted against that prefix's cap.
pub struct Admitted {
    slot: super::rank::Slot,
    pub criticality: Criticality,
    /// Its SYN as the program parses it, and the class it was charged to.
    pub syn: limiter_common::packet::Source,
    pub class: usize,
    fds: OwnedSemaphorePermit,
    pub ctx: Arc<Context>,
    pub prefix: PrefixKey,
    counted: bool,
}

/// The caps, at accept: a slot under the connection's criticality's
/// limit, a backend in service, descriptors, the adaptive throttle, and
/// a slot of the prefix's.
fn admit(f: &Shared, peer: SocketAddr, port: u16) -> Result<Admitted, (Shed, Criticality)> {
    let ctx = f.ctx.borrow().clone();
    let prefix = prefix_of(peer, &ctx);
    let syn = syn_source(prefix, port);
    let class = limiter_common::rules::classify(&ctx.config, &syn);
    let criticality = ctx.ranks.of_connection(peer, class);
    let shed = |why| (why, criticality);
    let slot = f.slots.take(criticality).ok_or(shed(Shed::MaxConnections))?;
    if !f.backends.list.iter().any(super::backend::Backend::up) {
        return Err(shed(Shed::NoBackend));
    }
    let fds =
        Arc::clone(&f.fds).try_acquire_many_owned(super::fds::cost(f.cfg.copy)).map_err(|_| shed(Shed::Descriptors))?;
    if f.adaptive.as_ref().is_some_and(|a| a.refuse(criticality)) {
        return Err(shed(Shed::Adaptive));
    }
    let cap = f.cfg.max_connections_per_prefix;
    if cap == 0 {
        return Ok(Admitted { slot, criticality, syn, class, fds, ctx, prefix, counted: false });
    }
    let mut counts = f.prefixes.lock().expect("not poisoned");
    let n = counts.entry(prefix).or_insert(0);
    if *n >= cap {
        return Err(shed(Shed::MaxPerPrefix));
    }
    *n += 1;
    Ok(Admitted { slot, criticality, syn, class, fds, ctx, prefix, counted: true })
}

fn release(counts: &PrefixCounts, key: Option<PrefixKey>) {
    let Some(key) = key else { return };
    let mut c = counts.lock().expect("not poisoned");
    if let Some(n) = c.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            c.remove(&key);
        }
    }
}

/// A SYN from `prefix` to `port`, as the program parses it: what the
/// class of a connection, and its bucket's key, are computed from.
#[must_use]
pub fn syn_source((family, prefix): PrefixKey, port: u16) -> limiter_common::packet::Source {
    use limiter_common::packet;
    let mut src = packet::Source {
        family,
        proto: packet::IPPROTO_TCP,
        port_known: 1,
        syn: 1,
        dport: port,
        ..packet::Source::default()
    };
    for (i, w) in prefix.chunks(4).enumerate() {
        src.addr[i] = u32::from_ne_bytes(w.try_into().expect("4 bytes"));
    }
    src
}

/// The source prefix of `peer` by the policy's prefix lengths.
#[must_use]
pub fn prefix_of(peer: SocketAddr, ctx: &Context) -> PrefixKey {
    use limiter_common::prefix::{mask_v4, mask_v6};
    let mut out = [0u8; 16];
    match peer.ip().to_canonical() {
        std::net::IpAddr::V4(a) => {
            let m = mask_v4(u32::from_ne_bytes(a.octets()), ctx.config.v4_prefix);
            out[..4].copy_from_slice(&m.to_ne_bytes());
            (limiter_common::family::IPV4, out)
        }
        std::net::IpAddr::V6(a) => {
            let o = a.octets();
            let words =
                std::array::from_fn(|i| u32::from_ne_bytes([o[i * 4], o[i * 4 + 1], o[i * 4 + 2], o[i * 4 + 3]]));
            for (chunk, w) in out.chunks_mut(4).zip(mask_v6(words, ctx.config.v6_prefix)) {
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
            (limiter_common::family::IPV6, out)
        }
    }
}

/// A connect error of this host's own (descriptors, buffers, memory).
fn local_failure(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// One accepted connection to its end.
async fn serve(client: TcpStream, peer: SocketAddr, local: Option<SocketAddr>, admitted: &Admitted, f: &Shared) {
    let Some(local) = local.or_else(|| client.local_addr().ok()) else { return };
    let mut tried = Vec::new();
    let (backend, index) = loop {
        // Connect failures are the passive health check's (the backend
        // goes out of service, then is probed back), not adaptive
        // throttling's: that counts what the tenant layer does with the
        // connections it took, and a remembered outage would slow the
        // recovery after it for a whole window.
        let Some(i) = f.backends.pick(&tried) else {
            f.stats.backend_failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        tried.push(i);
        let u = &f.backends.list[i];
        match tokio::time::timeout(f.cfg.connect_timeout, TcpStream::connect(u.addr)).await {
            Ok(Ok(s)) => {
                u.succeeded();
                break (s, i);
            }
            // This host is out of descriptors or buffers: the backend
            // is not to blame (and is not marked down for it).
            Ok(Err(e)) if local_failure(&e) => {
                u.untried();
                f.stats.local_errors.fetch_add(1, Ordering::Relaxed);
                f.warned.lock().expect("not poisoned")[1].note(|n| {
                    tracing::warn!(
                        "limiter: forward {}: {n} connection(s) not forwarded for lack of local resources ({e}); upstream {} not blamed",
                        f.cfg.name,
                        u.addr
                    );
                });
                return;
            }
            _ => {}
        }
        u.failed();
        f.stats.backend_connect_failures.fetch_add(1, Ordering::Relaxed);
        f.warned.lock().expect("not poisoned")[0].note(|n| {
            tracing::warn!(
                "limiter: forward {}: upstream {} failed ({n} connect failure(s) since last said); out of service for a while",
                f.cfg.name,
                u.addr
            );
        });
    };
    let u = &f.backends.list[index];
    u.active.fetch_add(1, Ordering::Relaxed);
    let header = match f.cfg.proxy_protocol {
        ProxyProtocol::Off => Vec::new(),
        ProxyProtocol::V1 => proxy::v1(peer, local),
        ProxyProtocol::V2 => {
            let id = f.next_id.fetch_add(1, Ordering::Relaxed);
            proxy::v2(peer, local, id, &super::verdict(f, admitted))
        }
    };
    let _ = splice(client, backend, &header, f).await;
    u.active.fetch_sub(1, Ordering::Relaxed);
    f.stats.completed.fetch_add(1, Ordering::Relaxed);
}

/// Copy both ways until both sides are done, the connection has been idle
/// for the idle timeout, or the forwarder is told to stop its
/// connections (the drain timeout ran out).
async fn splice(client: TcpStream, backend: TcpStream, header: &[u8], f: &Shared) -> std::io::Result<()> {
    // The client's socket has TCP_NODELAY from its listener (`bind`).
    let _ = backend.set_nodelay(true);
    // A failure to pass the header or the client's first bytes on is
    // not counted as the tenant's refusal: it cannot be told whose it is.
    let sent = super::copy::open(header, &client, &backend, f.cfg.idle_timeout).await?;
    f.stats.bytes_up.fetch_add(sent as u64, Ordering::Relaxed);
    let act = Activity::new(f.cfg.idle_timeout);
    let mut kill = f.kill.subscribe();
    // The tenant layer answered: an accept, for adaptive throttling; a
    // connection that ends without a byte back was not accepted.
    let answered = AtomicBool::new(false);
    let first = || {
        answered.store(true, Ordering::Relaxed);
        if let Some(a) = &f.adaptive {
            a.resolved(true);
        }
    };
    let done = AtomicBool::new(false);
    // Who ended first without an answer: the client (closed or reset its
    // side) is not the tenant layer refusing, so it is not counted (one
    // client closing at once 40 times a second drove the refusal
    // probability to 0.9 and shed the users); the backend closing, or
    // the idle timeout while the client waits, is.
    let (backend_ended, client_first) = (AtomicBool::new(false), AtomicBool::new(false));
    let up = async {
        pump(f.cfg.copy, &client, &backend, &f.stats.bytes_up, &act, None, &done).await;
        client_first.store(!backend_ended.load(Ordering::Relaxed), Ordering::Relaxed);
    };
    let down = async {
        pump(f.cfg.copy, &backend, &client, &f.stats.bytes_down, &act, Some(&first), &done).await;
        backend_ended.store(true, Ordering::Relaxed);
    };
    // Polled in order, the copying first: no random draw a wake.
    let killed = tokio::select! {
        biased;
        _ = async { tokio::join!(up, down) } => false,
        () = super::copy::idle(&act) => false,
        _ = kill.changed() => true,
    };
    let refused = !answered.load(Ordering::Relaxed) && !client_first.load(Ordering::Relaxed) && !killed;
    if let Some(a) = f.adaptive.as_ref().filter(|_| refused) {
        a.resolved(false);
    }
    Ok(())
}

/// The counters of one forwarder.
impl Stats {
    #[must_use]
    pub fn shed_count(&self, why: Shed) -> u64 {
        self.shed[why as usize].load(Ordering::Relaxed)
    }
}
