//! The copy path on real loopback sockets: what is copied and what is
//! spliced, ends of stream that come with the last bytes, bytes that come
//! after a read emptied the socket, and the PROXY header's first write.

use std::{
    sync::atomic::{AtomicBool, AtomicU64},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::timeout,
};

use super::{Activity, Copy, Moved, open, pump};
use crate::forward::loopback::{pair, pattern};

const WAIT: Duration = Duration::from_secs(10);

/// Pumps `from` to `to` by `how` while `drive` runs; returns what the
/// pump moved (it ends at `from`'s end of stream) and `drive`'s output.
async fn through<T>(how: Copy, from: &TcpStream, to: &TcpStream, drive: impl Future<Output = T>) -> (Moved, T) {
    let (bytes, act, done) = (AtomicU64::new(0), Activity::new(WAIT), AtomicBool::new(false));
    let p = pump(how, from, to, &bytes, &act, None, &done);
    let (moved, out) = timeout(WAIT, async { tokio::join!(p, drive) }).await.expect("the pump ended in time");
    assert_eq!(bytes.into_inner(), moved.copied + moved.spliced, "every byte counted");
    (moved, out)
}

/// `bulk` and the end of stream from `client`; `server` reads them
/// intact.
async fn long_transfer(client: &mut TcpStream, server: &mut TcpStream, bulk: &[u8], what: &str) {
    let (mut got, send) = (Vec::new(), async {
        client.write_all(bulk).await.unwrap();
        client.shutdown().await.unwrap();
    });
    let ((), n) = tokio::join!(send, server.read_to_end(&mut got));
    n.unwrap();
    assert!(got == bulk, "{what}: the long transfer arrived intact ({} of {} bytes)", got.len(), bulk.len());
}

#[tokio::test(flavor = "current_thread")]
async fn small_exchanges_are_copied_and_bulk_is_spliced() {
    for how in [Copy::Splice, Copy::Buffer] {
        let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
        let small = 1000;
        let bulk = pattern(8 << 20, 3);
        let drive = async {
            // 1,000 requests of 100 bytes (more than a direction once
            // copied before splicing), each read before the next is sent.
            let mut buf = [0u8; 100];
            for i in 0..small {
                let msg = pattern(100, i);
                client.write_all(&msg).await.unwrap();
                server.read_exact(&mut buf).await.unwrap();
                assert_eq!(buf[..], msg[..], "request {i}");
            }
            // Then a long transfer, and the end of stream.
            long_transfer(&mut client, &mut server, &bulk, &format!("{how:?}")).await;
        };
        let (moved, ()) = through(how, &fin, &fout, drive).await;
        let total = (small * 100 + bulk.len()) as u64;
        assert_eq!(moved.copied + moved.spliced, total, "{how:?}");
        match how {
            // The small requests were all copied (a splice starts only
            // after a read filled the buffer), and most of the bulk spliced.
            Copy::Splice => assert!(
                moved.copied >= (small * 100) as u64 && moved.spliced >= total / 2,
                "small copied, bulk spliced: {moved:?}"
            ),
            Copy::Buffer => assert_eq!(moved.spliced, 0, "buffer never splices"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn small_exchanges_go_through_the_batch_intact_and_bulk_around_it() {
    super::super::batch::start();
    let before = super::super::batch::counts().expect("io_uring on this machine");
    let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
    let bulk = pattern(2 << 20, 9);
    let drive = async {
        let mut buf = [0u8; 300];
        for i in 0..1000 {
            let msg = pattern(100 + i % 200, i);
            client.write_all(&msg).await.unwrap();
            server.read_exact(&mut buf[..msg.len()]).await.unwrap();
            assert_eq!(buf[..msg.len()], msg[..], "request {i}");
        }
        long_transfer(&mut client, &mut server, &bulk, "batch").await;
    };
    let (moved, ()) = through(Copy::Buffer, &fin, &fout, drive).await;
    let after = super::super::batch::counts().unwrap();
    // Each small request was one queued write; the bulk mostly went
    // around the batch (reads that filled the buffer are written at once).
    assert!(after.writes - before.writes >= 1000, "{before:?} -> {after:?}");
    assert!(after.writes - before.writes < 1000 + (bulk.len() / 4096) as u64, "{before:?} -> {after:?}");
    assert_eq!(moved.copied, (1000 * 100 + (0..1000).map(|i| i % 200).sum::<usize>() + bulk.len()) as u64);
}

#[tokio::test(flavor = "current_thread")]
async fn the_last_bytes_of_a_stream_that_ended_skip_the_batch() {
    super::super::batch::start();
    let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
    // An answer and its close, both there before the pump first looks.
    client.write_all(b"last answer").await.unwrap();
    client.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = super::super::batch::counts().expect("io_uring on this machine");
    let mut got = Vec::new();
    let (moved, n) = through(Copy::Buffer, &fin, &fout, server.read_to_end(&mut got)).await;
    n.unwrap();
    assert_eq!(got, b"last answer");
    assert_eq!(moved.copied, 11);
    assert_eq!(super::super::batch::counts().unwrap().writes, before.writes, "written through the batch");
}

/// Segments `s` has received (`tcpi_segs_in` of `TCP_INFO`).
fn segments_in(s: &TcpStream) -> u32 {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a zeroed tcp_info filled by getsockopt on a socket we own.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = u32::try_from(size_of::<libc::tcp_info>()).unwrap();
        let r =
            libc::getsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &raw mut len);
        assert_eq!(r, 0, "TCP_INFO");
        info.tcpi_segs_in
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_last_bytes_of_a_stream_that_ended_leave_with_its_close_in_one_segment() {
    for how in [Copy::Splice, Copy::Buffer] {
        let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
        // An answer and its close, both there before the pump first looks.
        client.write_all(b"last answer").await.unwrap();
        client.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = segments_in(&server);
        let mut got = Vec::new();
        let (moved, n) = through(how, &fin, &fout, server.read_to_end(&mut got)).await;
        n.unwrap();
        assert_eq!((got.as_slice(), moved.copied), (&b"last answer"[..], 11), "{how:?}");
        // The bytes and the half-close: one segment, not one each.
        assert_eq!(segments_in(&server) - before, 1, "{how:?}: segments for the answer and its close");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_end_of_stream_that_came_with_the_last_bytes_is_passed_on() {
    let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
    // Both queued before the pump first reads: one short read takes the
    // bytes, and the end of stream must still be heard.
    client.write_all(b"last words").await.unwrap();
    client.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let drive = async {
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        got
    };
    let (moved, got) = through(Copy::Splice, &fin, &fout, drive).await;
    assert_eq!(got, b"last words");
    assert_eq!(moved.copied, 10);
}

#[tokio::test(flavor = "current_thread")]
async fn bytes_that_come_after_a_read_emptied_the_socket_are_not_missed() {
    let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
    let drive = async {
        let mut buf = [0u8; 5];
        for i in 0..20u8 {
            // A short read empties the socket and forgets its readiness;
            // the next bytes, a while later, must wake it again.
            client.write_all(&[i; 5]).await.unwrap();
            timeout(Duration::from_secs(2), server.read_exact(&mut buf)).await.expect("forwarded").unwrap();
            assert_eq!(buf, [i; 5]);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        client.shutdown().await.unwrap();
    };
    let (moved, ()) = through(Copy::Splice, &fin, &fout, drive).await;
    assert_eq!(moved.copied, 100);
}

#[tokio::test(flavor = "current_thread")]
async fn the_proxy_header_takes_the_clients_first_bytes_along() {
    let header = b"PROXY TCP4 198.18.0.1 198.18.0.2 1 2\r\n";
    // The client has spoken: its request goes in the header's write.
    let ((mut client, fin), (fout, mut server)) = (pair().await, pair().await);
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    fin.readable().await.unwrap();
    let sent = open(header, &fin, &fout, WAIT).await.unwrap();
    assert_eq!(sent, 18, "the request went with the header");
    let mut got = vec![0u8; header.len() + 18];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..header.len()], header);
    assert_eq!(&got[header.len()..], b"GET / HTTP/1.1\r\n\r\n");
    // A client that waits for the server to speak first: the header goes
    // alone, at once.
    let ((_quiet, fin), (fout, mut server)) = (pair().await, pair().await);
    assert_eq!(open(header, &fin, &fout, WAIT).await.unwrap(), 0);
    let mut got = vec![0u8; header.len()];
    timeout(Duration::from_secs(2), server.read_exact(&mut got)).await.expect("the header alone").unwrap();
    assert_eq!(&got[..], header);
}
