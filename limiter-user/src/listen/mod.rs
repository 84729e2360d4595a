//! The accept loop every listener of the daemon runs (control socket,
//! `/metrics`, feedback): an accept error (descriptors exhausted, a
//! signal) is logged at most every 10 s and retried after a back-off,
//! never the end of the loop; at most `max_conns` connections are served
//! at once, shared fairly among peers ([`fair`]): a peer past its share,
//! or a full listener, sheds an idle connection before a new one is
//! refused, and the excess is closed at once, never queued, so a flood of
//! clients cannot hold the daemon's descriptors or memory, nor crowd out
//! another client.

pub mod fair;
pub mod peer;
pub mod rate;

use std::{
    future::Future,
    io,
    time::{Duration, Instant},
};

use tokio::net::{TcpListener, UnixListener};

pub use fair::{Busy, Conn};
pub use peer::Peer;

/// Something that accepts connections, and says who made them.
pub trait Accept: Send + 'static {
    type Stream: Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Stream, Peer)>> + Send;
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<(Self::Stream, Peer)> {
        let (s, _) = UnixListener::accept(self).await?;
        // Without credentials (cannot happen on Linux) all such share one.
        let uid = s.peer_cred().map_or(u32::MAX, |c| c.uid());
        Ok((s, Peer::Uid(uid)))
    }
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<(Self::Stream, Peer)> {
        let (s, addr) = TcpListener::accept(self).await?;
        let peer = match s.local_addr() {
            Ok(local) => peer::tcp(local, addr),
            Err(_) => Peer::Addr(addr.ip()),
        };
        Ok((s, peer))
    }
}

/// First and longest pause after a failed accept.
pub(crate) const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));
/// Accept errors are logged at most this often (with how many were not).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Accept on `listener` for ever, handing each connection to `handle` on a
/// task of its own, which holds the connection's slot until it ends.
pub fn spawn<L, F, Fut>(name: &'static str, listener: L, max_conns: usize, handle: F)
where
    L: Accept,
    F: Fn(L::Stream, Conn) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = fair::Slots::new(max_conns);
    tokio::spawn(async move {
        let mut backoff = BACKOFF.0;
        let mut errors = ErrorLog::default();
        let (mut refused, mut shed) = (ErrorLog::default(), ErrorLog::default());
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff = BACKOFF.0;
                    let (verdict, conn) = slots.admit(peer);
                    let id = match verdict {
                        fair::Admit::Yes(id) => id,
                        fair::Admit::Shed(id, whose) => {
                            shed.note(|n| {
                                tracing::info!(
                                    "limiter: {name}: full or a peer at its share; shed {n} idle connection(s), the last of {}",
                                    whose
                                );
                            });
                            id
                        }
                        fair::Admit::No => {
                            // Closed at once: the client sees its connection end.
                            drop(stream);
                            refused.note(|n| {
                                tracing::warn!(
                                    "limiter: {name}: {max_conns} connections in use ({} at most per peer, all busy); closed {n} more at accept, the last from {peer}",
                                    slots.share()
                                );
                            });
                            continue;
                        }
                    };
                    let served = handle(stream, conn);
                    let ends = std::sync::Arc::clone(&slots);
                    let task = tokio::spawn(async move {
                        let _slot = Ended(ends, id);
                        served.await;
                    });
                    slots.started(id, task.abort_handle());
                }
                Err(e) => {
                    errors.note(|n| tracing::warn!("limiter: {name}: accept failed ({n} times since last said): {e}"));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF.1);
                }
            }
        }
    });
}

/// Frees a connection's slot when its task ends or is shed.
struct Ended(std::sync::Arc<fair::Slots>, u64);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended(self.1);
    }
}

/// Counts events and says so at most every [`LOG_EVERY`].
#[derive(Default)]
pub(crate) struct ErrorLog {
    last: Option<Instant>,
    unsaid: u64,
}

impl ErrorLog {
    pub(crate) fn note(&mut self, say: impl FnOnce(u64)) {
        self.unsaid += 1;
        if self.last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            say(self.unsaid);
            self.last = Some(Instant::now());
            self.unsaid = 0;
        }
    }
}

/// Raise this process's descriptor limit to its hard limit: more room
/// before accept fails, at no cost until used.
pub fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_said_once_per_period_with_a_count() {
        let mut log = ErrorLog::default();
        let mut said = Vec::new();
        for _ in 0..1000 {
            log.note(|n| said.push(n));
        }
        assert_eq!(said, [1], "the first is said at once, the rest wait for the period");
        log.last = Some(Instant::now().checked_sub(LOG_EVERY).unwrap());
        log.note(|n| said.push(n));
        assert_eq!(said, [1, 1000]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn busy_connections_past_a_peers_share_are_closed_at_once_and_idle_ones_shed() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let dir = std::env::temp_dir().join(format!("limiter-listen-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        // Each served connection holds its slot until the client closes,
        // busy once it has written "b" (a share of 8 / 4 = 2 per uid).
        spawn("test", listener, 8, |mut s: tokio::net::UnixStream, c: Conn| async move {
            let mut b = [0; 1];
            let _ = s.read(&mut b).await;
            let _busy = (b == *b"b").then(|| c.busy());
            let _ = s.write_all(b"hi").await;
            let mut b = [0; 1];
            let _ = s.read(&mut b).await;
        });
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            c.write_all(b"b").await.unwrap();
            let mut b = [0; 2];
            c.read_exact(&mut b).await.unwrap();
            held.push(c);
        }
        let mut third = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut b = [0; 2];
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut b)).await.unwrap().unwrap();
        assert_eq!(n, 0, "the third connection is closed without an answer");
        drop(held);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Two idle connections (nothing sent), then a third: the oldest
        // idle one is shed and the newcomer served.
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(tokio::net::UnixStream::connect(&path).await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut fourth = tokio::net::UnixStream::connect(&path).await.unwrap();
        fourth.write_all(b"b").await.unwrap();
        fourth.read_exact(&mut b).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut b)).await.unwrap().unwrap();
        assert_eq!(n, 0, "the oldest idle connection was shed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
