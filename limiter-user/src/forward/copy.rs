//! Moving a connection's bytes both ways: `splice(2)` through a pipe per
//! direction (the bytes never reach user space) or `read`/`write`
//! through a bounded buffer. Both pass a half-close on and stop when
//! neither direction has moved for the idle timeout, and a write that
//! cannot drain for the idle timeout (a peer that stopped reading) ends
//! the connection too: a stalled connection holds at most its sockets'
//! kernel buffers and 16 KiB (`buffer`) or a 64 KiB pipe (`splice`) per
//! direction, for at most the idle timeout. `cargo xtask bench forward`
//! measures the two side by side.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _, Interest},
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
};

use crate::policy::forward::Copy;

/// Bytes buffered per direction of a connection (`copy = "buffer"`).
const BUF: usize = 16 << 10;
/// Most bytes one `splice` call moves (a default pipe holds 64 KiB).
const CHUNK: usize = 64 << 10;

/// When either direction last moved, for the shared idle timeout.
pub struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    idle: Duration,
}

impl Activity {
    #[must_use]
    pub fn new(idle: Duration) -> Self {
        Self { start: Instant::now(), last_ms: AtomicU64::new(0), idle }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn moved(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Neither direction has moved for the idle timeout.
    fn idle(&self) -> bool {
        let since = self.now_ms().saturating_sub(self.last_ms.load(Ordering::Relaxed));
        Duration::from_millis(since) >= self.idle
    }
}

/// Called once, when the first bytes of a direction arrive.
pub type OnFirst<'a> = Option<&'a (dyn Fn() + Sync)>;

/// One direction, `r` to `w`, by `how`; counts into `bytes`, calls
/// `first` when the first bytes arrive, and passes the end of stream on
/// as a half-close.
pub async fn pump(
    how: Copy,
    r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    bytes: &AtomicU64,
    act: &Activity,
    first: OnFirst<'_>,
) {
    let _ = match how {
        Copy::Buffer => buffered(r, &mut w, bytes, act, first).await,
        Copy::Splice => spliced(r.as_ref(), w.as_ref(), bytes, act, first).await,
    };
    let _ = w.shutdown().await;
}

/// `$ready` (a future), re-made until it finishes; returns `Ok(())` from
/// the enclosing function once the connection has been idle in both
/// directions for the idle timeout.
macro_rules! unless_idle {
    ($act:expr, $ready:expr) => {
        loop {
            match tokio::time::timeout($act.idle, $ready).await {
                Ok(v) => break v,
                Err(_) if $act.idle() => return Ok(()),
                Err(_) => {}
            }
        }
    };
}

async fn buffered(
    mut r: OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    bytes: &AtomicU64,
    act: &Activity,
    mut first: OnFirst<'_>,
) -> io::Result<()> {
    let mut buf = vec![0u8; BUF];
    loop {
        let n = unless_idle!(act, r.read(&mut buf))?;
        if n == 0 {
            return Ok(());
        }
        if let Some(f) = first.take() {
            f();
        }
        // A peer that stops reading: this write never drains.
        tokio::time::timeout(act.idle, w.write_all(&buf[..n])).await.map_err(|_| stalled())??;
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        act.moved();
    }
}

/// A write that could not drain for the idle timeout.
fn stalled() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the peer read nothing for the idle timeout")
}

/// A pipe whose two ends close with it.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just created and are owned by nothing else.
        Ok(unsafe { Self { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } })
    }
}

/// `splice(2)` `len` bytes from `from` to `to`, never blocking.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: descriptors owned by the caller; null offsets (sockets, pipes).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Socket to pipe, once the socket is readable.
async fn fill(r: &TcpStream, rfd: RawFd, pw: RawFd) -> io::Result<usize> {
    loop {
        r.readable().await?;
        match r.try_io(Interest::READABLE, || splice(rfd, pw, CHUNK)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
    }
}

async fn spliced(
    r: &TcpStream,
    w: &TcpStream,
    bytes: &AtomicU64,
    act: &Activity,
    mut first: OnFirst<'_>,
) -> io::Result<()> {
    let pipe = Pipe::new()?;
    let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
    let (pr, pw) = (pipe.read.as_raw_fd(), pipe.write.as_raw_fd());
    loop {
        // Socket to pipe: readiness through tokio, the move in the kernel.
        let mut left = unless_idle!(act, fill(r, rfd, pw))?;
        if left == 0 {
            return Ok(());
        }
        if let Some(f) = first.take() {
            f();
        }
        bytes.fetch_add(left as u64, Ordering::Relaxed);
        // Pipe to socket: all of it, before reading more (within the idle
        // timeout: a peer that stops reading never lets it drain).
        while left > 0 {
            tokio::time::timeout(act.idle, w.writable()).await.map_err(|_| stalled())??;
            match w.try_io(Interest::WRITABLE, || splice(pr, wfd, left)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        act.moved();
    }
}
