//! The batch on real loopback sockets: one call for a tick's writes,
//! what a socket cannot take comes back, a write dropped before its
//! batch is never sent, and no batch outlives its runtime.

use std::{os::fd::AsRawFd as _, time::Duration};

use tokio::{io::AsyncReadExt as _, time::timeout};

use super::{Counts, counts, queue, start};
use crate::forward::loopback::{pair, pattern};

/// `n` loopback pairs, one `len`-byte write queued on each without
/// yielding (the flusher runs once this task waits): each is taken whole
/// and read intact at its peer. Returns what the batch counted meanwhile.
async fn one_write_on_each(n: usize, len: usize) -> Counts {
    start();
    let mut pairs = Vec::new();
    for _ in 0..n {
        pairs.push(pair().await);
    }
    let before = counts().expect("io_uring here");
    let queued: Vec<_> =
        pairs.iter().enumerate().map(|(i, (_, ours))| queue(ours.as_raw_fd(), &pattern(len, i)).unwrap()).collect();
    for q in queued {
        let left = timeout(Duration::from_secs(10), q).await.expect("every write sent");
        assert!(left.unwrap().is_empty(), "a socket with room took all");
    }
    let after = counts().unwrap();
    for (i, (peer, _)) in pairs.iter_mut().enumerate() {
        let mut got = vec![0u8; len];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got[..], pattern(len, i)[..], "connection {i}");
    }
    Counts { calls: after.calls - before.calls, writes: after.writes - before.writes }
}

#[tokio::test(flavor = "current_thread")]
async fn the_writes_of_one_tick_go_in_one_call() {
    assert_eq!(one_write_on_each(8, 100).await, Counts { calls: 1, writes: 8 });
}

#[tokio::test(flavor = "current_thread")]
async fn more_writes_than_the_ring_holds_go_in_more_calls() {
    // 256 entries a call: 260 writes in 2.
    assert_eq!(one_write_on_each(260, 10).await, Counts { calls: 2, writes: 260 });
}

#[tokio::test(flavor = "current_thread")]
async fn what_a_socket_cannot_take_comes_back() {
    start();
    let (mut peer, ours) = pair().await;
    // Fill the writer's socket until it takes nothing more.
    let mut sent = 0usize;
    let fill = vec![0u8; 64 << 10];
    while let Ok(n) = ours.try_write(&fill) {
        sent += n;
    }
    let msg = pattern(4 << 10, 5);
    let left = queue(ours.as_raw_fd(), &msg).unwrap().await.unwrap();
    assert!(!left.is_empty(), "a full socket took the whole write");
    let took = msg.len() - left.len();
    assert_eq!(left[..], msg[took..], "what comes back is the write's tail");
    // Nothing lost nor doubled: the peer reads the fill, then exactly the
    // part the socket took.
    let mut got = vec![0u8; sent + took];
    timeout(Duration::from_secs(10), peer.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(got[sent..], msg[..took]);
    drop(ours);
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "bytes beyond what the socket took: {}", rest.len());
}

#[tokio::test(flavor = "current_thread")]
async fn a_write_dropped_before_its_batch_is_never_sent() {
    start();
    let ((mut gone_peer, gone), (mut peer, ours)) = (pair().await, pair().await);
    let before = counts().unwrap();
    drop(queue(gone.as_raw_fd(), b"never").unwrap());
    assert!(queue(ours.as_raw_fd(), b"sent").unwrap().await.unwrap().is_empty());
    assert_eq!(counts().unwrap().writes - before.writes, 1);
    let mut got = [0u8; 4];
    peer.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"sent");
    let mut buf = [0u8; 8];
    let r = timeout(Duration::from_millis(200), gone_peer.read(&mut buf)).await;
    assert!(r.is_err(), "the dropped write arrived: {r:?}");
}

#[test]
fn no_batch_outlives_its_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        start();
        tokio::task::yield_now().await;
    });
    assert!(rt.block_on(async { counts() }).is_some());
    drop(rt);
    // A write now would wait for a flusher that no longer runs: none is
    // queued, the caller writes at once.
    assert!(counts().is_none());
    assert!(queue(0, b"x").is_none());
}
