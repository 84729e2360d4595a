//! Moving a connection's bytes both ways: `read`/`write` through the
//! runtime thread's scratch buffer (a connection keeps only what its
//! writer could not take at once), and, with `copy = "splice"`, while a
//! direction carries bulk (a read filled the scratch buffer),
//! `splice(2)` through a pipe (the bytes never reach user space); a
//! splice that finds less than a buffer's worth goes back to copying, so
//! small requests and answers are never spliced. A read that returns less
//! than it asked for emptied the socket, so no read is spent to learn
//! that it would block. Both pass a half-close on and stop when neither
//! direction has moved for the idle timeout, and a write that cannot
//! drain for the idle timeout (a peer that stopped reading) ends the
//! connection too: a stalled connection holds at most its sockets'
//! kernel buffers and 16 KiB (`buffer`) or a 64 KiB pipe (`splice`) per
//! direction, for at most the idle timeout. `cargo xtask bench forward`
//! measures the two side by side.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Duration,
};

use tokio::{io::Interest, net::TcpStream};

use crate::policy::forward::Copy;

/// Bytes buffered per direction of a connection (`copy = "buffer"`), and
/// what a read must fill for the direction to count as bulk.
const BUF: usize = 16 << 10;
/// Most bytes one `splice` call moves (a default pipe holds 64 KiB).
const CHUNK: usize = 64 << 10;

/// When either direction last moved, for the shared idle timeout, by
/// the coarse monotonic clock (a tick of a few ms, read without the
/// TSC: every read of a connection stamps it).
pub struct Activity {
    last_ms: AtomicU64,
    idle: Duration,
}

impl Activity {
    #[must_use]
    pub fn new(idle: Duration) -> Self {
        Self { last_ms: AtomicU64::new(now_ms()), idle }
    }

    fn moved(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// `CLOCK_MONOTONIC_COARSE` in ms.
fn now_ms() -> u64 {
    crate::dataplane::maps::monotonic_coarse_ns() / 1_000_000
}

/// Called once, when the first bytes of a direction arrive.
pub type OnFirst<'a> = Option<&'a (dyn Fn() + Sync)>;

/// What one direction moved, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub copied: u64,
    pub spliced: u64,
}

/// One direction, `r` to `w`, by `how`; counts into `bytes`, calls
/// `first` when the first bytes arrive, and passes the end of stream on
/// as a half-close, unless the other direction (`other_done`, shared by
/// the two) has ended already: both sockets close next, which says it.
pub async fn pump(
    how: Copy,
    r: &TcpStream,
    w: &TcpStream,
    bytes: &AtomicU64,
    act: &Activity,
    first: OnFirst<'_>,
    other_done: &AtomicBool,
) -> Moved {
    let mut moved = Moved::default();
    let _ = run(how, r, w, bytes, act, first, &mut moved).await;
    if !other_done.swap(true, Ordering::Relaxed) {
        // SAFETY: shutdown(2) on a socket the caller owns.
        unsafe { libc::shutdown(w.as_raw_fd(), libc::SHUT_WR) };
    }
    moved
}

/// Ends once neither direction has moved for the idle timeout: one timer
/// per connection, re-armed only when it fires (a timer per read would
/// cost each small exchange a timer wheel insert and removal).
pub async fn idle(act: &Activity) {
    loop {
        let since = Duration::from_millis(now_ms().saturating_sub(act.last_ms.load(Ordering::Relaxed)));
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
    /// `n` bytes read, their write queued in the tick's batch.
    Queued(usize, super::batch::Queued),
}

/// `recv(2)` into `buf` (a socket's own call: `read(2)` goes through the
/// file layer first; the socket never blocks, so never sleeps to be
/// interrupted).
fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reads at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// A read that also forgets the socket's readiness when it returned less
/// than `buf` holds: a TCP read takes all that is queued, so the socket
/// is empty, and the next read would only say it would block (haproxy
/// and nginx save that read the same way). Bytes that arrive after it
/// wake the socket again (epoll is edge-triggered: each arrival is an
/// event), and an end of stream seen already is kept (tokio never clears
/// a read-closed readiness).
fn read_drained(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let (fd, len) = (s.as_raw_fd(), buf.len());
    let mut got = 0;
    let r = s.try_io(Interest::READABLE, || {
        got = read(fd, buf)?;
        if got > 0 && got < len { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(got) }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        other => other,
    }
}

/// One read and its write. The stream's end already seen (`ended`), the
/// bytes that empty the socket are its last: they go out at once, with
/// `MSG_MORE`, so the half-close or close that follows leaves in the same
/// segment (one segment and the peer's acknowledgement of it fewer, as
/// haproxy does for an answer it closes after). Otherwise a small write
/// is queued in the tick's batch.
fn step(from: &TcpStream, to: &TcpStream, ended: bool) -> io::Result<Step> {
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let read = match read_drained(from, &mut scratch[..]) {
            Ok(0) => return Ok(Step::Eof),
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::NotReady),
            Err(e) => return Err(e),
        };
        if !ended
            && read <= super::batch::SMALL
            && let Some(q) = super::batch::queue(to.as_raw_fd(), &scratch[..read])
        {
            return Ok(Step::Queued(read, q));
        }
        let last = ended && read < scratch.len();
        let left = write_now(to, &scratch[..read], last)?;
        Ok(if left.is_empty() { Step::Moved(read) } else { Step::Left(read, left) })
    })
}

/// Writes what `to` takes of `buf` now; returns the rest (empty, and
/// unallocated, when it took all). `more`: a shutdown or close follows
/// at once and carries the bytes out (`MSG_MORE` holds back a partial
/// segment until then).
fn write_now(to: &TcpStream, buf: &[u8], more: bool) -> io::Result<Vec<u8>> {
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let sock = socket2::SockRef::from(to);
    let send = || sock.send_with_flags(buf, flags);
    let written = match to.try_io(Interest::WRITABLE, send) {
        Ok(written) => written,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    Ok(buf[written..].to_vec())
}

/// The PROXY header to `backend`, and in the same write the client's
/// first bytes when they have come already (they usually have, by the
/// time the backend's connect completes): one segment and one system
/// call fewer a connection, and the backend woken once. Returns how
/// many of the client's bytes went with it.
pub async fn open(header: &[u8], client: &TcpStream, backend: &TcpStream, idle: Duration) -> io::Result<usize> {
    if header.is_empty() {
        return Ok(0);
    }
    if header.len() > BUF / 2 {
        write_all(backend, header, idle).await?;
        return Ok(0);
    }
    let (read, left) = SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let h = header.len();
        scratch[..h].copy_from_slice(header);
        // Nothing yet (or the end of stream, which the pump then sees
        // again): the header goes alone.
        let read = read_drained(client, &mut scratch[h..]).unwrap_or(0);
        write_now(backend, &scratch[..h + read], false).map(|left| (read, left))
    })?;
    write_all(backend, &left, idle).await?;
    Ok(read)
}

/// All of `buf` to `w`, within the idle timeout.
async fn write_all(w: &TcpStream, buf: &[u8], idle: Duration) -> io::Result<()> {
    let sock = socket2::SockRef::from(w);
    drain(w, buf.len(), idle, |left| sock.send(&buf[buf.len() - left..])).await
}

/// `len` bytes out to `w` by `put` (given how many are left, it moves
/// some without blocking), each time `w` can take more, within the idle
/// timeout: a peer that stops reading never lets it drain.
async fn drain(
    w: &TcpStream,
    len: usize,
    idle: Duration,
    mut put: impl FnMut(usize) -> io::Result<usize>,
) -> io::Result<()> {
    let mut left = len;
    while left > 0 {
        tokio::time::timeout(idle, w.writable()).await.map_err(|_| stalled())??;
        match w.try_io(Interest::WRITABLE, || put(left)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(m) => left -= m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copy until the end of stream; with `Copy::Splice`, splice while the
/// direction carries bulk.
async fn run(
    how: Copy,
    r: &TcpStream,
    w: &TcpStream,
    bytes: &AtomicU64,
    act: &Activity,
    mut first: OnFirst<'_>,
    moved: &mut Moved,
) -> io::Result<()> {
    // Made when first needed; none (copying goes on) when no pipe of a
    // whole chunk can be had (no descriptor left, or the per-user limit).
    let mut pipe: Option<Option<Pipe>> = None;
    loop {
        // The peer's end of stream, when already seen, is known to follow
        // a read that empties the socket: no read is spent to hear it.
        let closed = r.ready(Interest::READABLE).await?.is_read_closed();
        // The last bytes of a stream that ended (an answer with its close)
        // go out at once, with the half-close or close that follows: the
        // connection ends next, and would otherwise wait a tick and a
        // wake-up for its batch.
        let n = match step(r, w, closed)? {
            Step::Eof => return Ok(()),
            Step::NotReady => continue,
            Step::Moved(n) => n,
            Step::Left(n, left) => {
                write_all(w, &left, act.idle).await?;
                n
            }
            Step::Queued(n, q) => {
                write_all(w, &q.await?, act.idle).await?;
                n
            }
        };
        if let Some(f) = first.take() {
            f();
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        moved.copied += n as u64;
        act.moved();
        if closed && n < BUF {
            return Ok(());
        }
        if how == Copy::Splice
            && n == BUF
            && let Some(pipe) = pipe.get_or_insert_with(|| Pipe::new().ok())
            && spliced(r, w, pipe, bytes, act, moved).await?
        {
            return Ok(());
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
    /// A pipe that holds a whole [`CHUNK`], or an error (the direction
    /// goes on copying): past `fs.pipe-user-pages-soft` (16,384 pages a
    /// user by default, 1,024 such pipes) the kernel gives an unprivileged
    /// user's new pipes 2 pages, and splicing 8 KiB at a time would cost
    /// more than copying.
    fn new() -> io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both were just created and are owned by nothing else.
        let pipe = unsafe { Self { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } };
        // SAFETY: fcntl on a descriptor we own.
        let size = unsafe { libc::fcntl(pipe.write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        if usize::try_from(size).unwrap_or(0) < CHUNK {
            return Err(io::Error::other("a pipe under 64 KiB (fs.pipe-user-pages-soft reached)"));
        }
        Ok(pipe)
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

/// Splice while each splice finds at least a scratch buffer's worth:
/// `Ok(true)` at the end of stream, `Ok(false)` to go back to copying.
async fn spliced(
    r: &TcpStream,
    w: &TcpStream,
    pipe: &Pipe,
    bytes: &AtomicU64,
    act: &Activity,
    moved: &mut Moved,
) -> io::Result<bool> {
    let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
    let (pr, pw) = (pipe.read.as_raw_fd(), pipe.write.as_raw_fd());
    loop {
        // Socket to pipe: readiness through tokio, the move in the kernel.
        let n = fill(r, rfd, pw).await?;
        if n == 0 {
            return Ok(true);
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        moved.spliced += n as u64;
        // Pipe to socket: all of it, before reading more.
        drain(w, n, act.idle, |left| splice(pr, wfd, left)).await?;
        act.moved();
        if n < BUF {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests;
