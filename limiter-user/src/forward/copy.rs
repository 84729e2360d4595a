//! Moving a connection's bytes both ways: `read`/`write` through the
//! runtime thread's scratch buffer (a connection keeps only what its
//! writer could not take at once), and, with `copy = "splice"`, past the
//! first [`SPLICE_AFTER`] bytes of a direction, `splice(2)` through a
//! pipe (the bytes never reach user space). Both pass a half-close on and stop when
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
    io::{AsyncWriteExt as _, Interest},
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
}

/// Called once, when the first bytes of a direction arrive.
pub type OnFirst<'a> = Option<&'a (dyn Fn() + Sync)>;

/// Bytes a direction moves through the scratch buffer before it is
/// spliced (`copy = "splice"`): a request and its answer cost fewer
/// system calls copied, and no pipe; past this it is a long transfer.
pub const SPLICE_AFTER: u64 = 64 << 10;

/// One direction, `r` to `w`, by `how`; counts into `bytes`, calls
/// `first` when the first bytes arrive, and passes the end of stream on
/// as a half-close. Spliced directions start copied ([`SPLICE_AFTER`]).
pub async fn pump(
    how: Copy,
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    bytes: &AtomicU64,
    act: &Activity,
    first: OnFirst<'_>,
) {
    let limit = match how {
        Copy::Buffer => u64::MAX,
        Copy::Splice => SPLICE_AFTER,
    };
    if let Ok(true) = buffered(&mut r, &mut w, bytes, act, first, limit).await {
        let _ = spliced(r.as_ref(), w.as_ref(), bytes, act).await;
    }
    let _ = w.shutdown().await;
}

/// Ends once neither direction has moved for the idle timeout: one timer
/// per connection, re-armed only when it fires (a timer per read would
/// cost each small exchange a timer wheel insert and removal).
pub async fn idle(act: &Activity) {
    loop {
        let since = Duration::from_millis(act.now_ms().saturating_sub(act.last_ms.load(Ordering::Relaxed)));
        let Some(left) = act.idle.checked_sub(since).filter(|l| !l.is_zero()) else { return };
        tokio::time::sleep(left).await;
    }
}

thread_local! {
    /// Each runtime thread's buffer: bytes pass through it between a read
    /// and the write that takes them at once, so a connection holds no
    /// buffer of its own but for what its writer could not take.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0u8; BUF].into_boxed_slice());
}

/// One read and the write of what it read, without waiting.
enum Step {
    Eof,
    NotReady,
    /// All `n` bytes written.
    Moved(usize),
    /// `n` bytes read, those in the vector not yet written.
    Left(usize, Vec<u8>),
}

fn step(from: &OwnedReadHalf, to: &OwnedWriteHalf) -> io::Result<Step> {
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let read = match from.try_read(&mut scratch[..]) {
            Ok(0) => return Ok(Step::Eof),
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::NotReady),
            Err(e) => return Err(e),
        };
        let written = match to.try_write(&scratch[..read]) {
            Ok(written) => written,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        Ok(if written == read { Step::Moved(read) } else { Step::Left(read, scratch[written..read].to_vec()) })
    })
}

/// Copy until the end of stream (`Ok(false)`) or until `limit` bytes
/// have moved (`Ok(true)`: the caller splices the rest).
async fn buffered(
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    bytes: &AtomicU64,
    act: &Activity,
    mut first: OnFirst<'_>,
    limit: u64,
) -> io::Result<bool> {
    let mut moved = 0u64;
    loop {
        r.readable().await?;
        let n = match step(r, w)? {
            Step::Eof => return Ok(false),
            Step::NotReady => continue,
            Step::Moved(n) => n,
            Step::Left(n, left) => {
                // A peer that stops reading: this write never drains.
                tokio::time::timeout(act.idle, w.write_all(&left)).await.map_err(|_| stalled())??;
                n
            }
        };
        if let Some(f) = first.take() {
            f();
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        act.moved();
        moved += n as u64;
        if moved >= limit {
            return Ok(true);
        }
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

async fn spliced(r: &TcpStream, w: &TcpStream, bytes: &AtomicU64, act: &Activity) -> io::Result<()> {
    let pipe = Pipe::new()?;
    let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
    let (pr, pw) = (pipe.read.as_raw_fd(), pipe.write.as_raw_fd());
    loop {
        // Socket to pipe: readiness through tokio, the move in the kernel.
        let mut left = fill(r, rfd, pw).await?;
        if left == 0 {
            return Ok(());
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
