//! Listening side of the control socket, hardened against its own users:
//! one daemon per socket path (a lock file beside it), never deleting a
//! path that is not a socket or not ours, at most [`MAX_CONNS`] clients at
//! once, a deadline on every read and write, and a cap on a request line.

use std::{
    fs::File,
    io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream, unix::OwnedWriteHalf},
    sync::{Semaphore, mpsc, oneshot},
};

use super::{ErrorCode, Request, Response};
use crate::listen::Conn;

/// A request from a client, with where its answer goes.
pub type Call = (Request, Reply);

/// Who sent a request (the audit trail names them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A control client: its uid and pid, as the kernel gives them for the
    /// socket (SO_PEERCRED), never as the client says.
    Client { uid: u32, pid: Option<i32> },
    /// The tenant layer, through the feedback endpoint: its connection's
    /// peer.
    Tenant { peer: String },
}

impl std::fmt::Display for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Requester::Client { uid, pid: Some(pid) } => write!(f, "uid {uid} pid {pid}"),
            Requester::Client { uid, pid: None } => write!(f, "uid {uid}"),
            Requester::Tenant { peer } => write!(f, "tenant {peer}"),
        }
    }
}

/// Where a request's answer goes, and who asked.
#[derive(Debug)]
pub struct Reply {
    tx: oneshot::Sender<Response>,
    pub by: Requester,
}

impl Reply {
    /// A reply for `by`'s request, and where its answer arrives.
    #[must_use]
    pub fn new(by: Requester) -> (Self, oneshot::Receiver<Response>) {
        let (tx, rx) = oneshot::channel();
        (Self { tx, by }, rx)
    }

    /// Answer; whether the client was still there to take it.
    #[must_use = "a client may be gone; say so where it matters"]
    pub fn send(self, r: Response) -> bool {
        self.tx.send(r).is_ok()
    }
}

/// Clients served at once; more are closed at accept.
pub const MAX_CONNS: usize = 64;
/// A request line (a whole policy file fits: see `policy::file::MAX_FILE_BYTES`).
pub const MAX_LINE: usize = 40 << 20;
/// Lines longer than this need the one large-request slot, so at most one
/// client at a time holds a big buffer.
const SMALL_LINE: usize = 1 << 20;
/// A request line must be complete this long after the connection opened
/// or the last answer; an answer must be taken this fast.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("creating the socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is served by another running limiter daemon (its lock {lock} is held)")]
    InUse { path: PathBuf, lock: PathBuf },
    #[error("locking {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} exists and is not a socket; refusing to replace it (choose another --socket)")]
    NotASocket { path: PathBuf },
    #[error("{path} is a socket another program is serving; refusing to replace it (choose another --socket)")]
    Live { path: PathBuf },
    #[error("binding the control socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("setting owner and mode of {path}")]
    Perms {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Who may use the socket besides root.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    pub gid: Option<u32>,
}

/// The control socket, bound and locked, not yet served. Dropping it
/// removes the socket file if it is still the one bound here.
pub struct Bound {
    path: PathBuf,
    listener: Option<UnixListener>,
    /// (device, inode) of the socket file bound here.
    id: (u64, u64),
    _lock: File,
    access: Access,
}

/// Lock `path` for this daemon (`PATH.lock`, flock) and bind it with mode
/// 0660 (group `access.gid` if any). A stale socket left by a daemon that
/// died is replaced; a live daemon's socket, or a path that is not a
/// socket, is refused.
pub fn bind(path: &Path, access: Access) -> Result<Bound, ServerError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::Dir { path: dir.into(), source })?;
    }
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let lock = crate::dataplane::pin::lock_exclusive(&lock_path, true).map_err(|e| match e {
        Some(source) => ServerError::Lock { path: lock_path.clone(), source },
        None => ServerError::InUse { path: path.into(), lock: lock_path.clone() },
    })?;
    match std::fs::symlink_metadata(path) {
        // We hold the lock: no limiter serves it. A socket something still
        // accepts on belongs to another program (unlinking it would cut
        // that program off): refused. One nobody accepts on was left by a
        // daemon that died: replaced.
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServerError::Live { path: path.into() });
            }
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => return Err(ServerError::NotASocket { path: path.into() }),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| ServerError::Bind { path: path.into(), source })?;
    let perms = |source| ServerError::Perms { path: path.into(), source };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(perms)?;
    let meta = std::fs::metadata(path).map_err(perms)?;
    // Created with our own group already when systemd runs us with
    // `Group=`; chown (which needs CAP_CHOWN) only when it differs.
    if let Some(gid) = access.gid
        && meta.gid() != gid
    {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(perms)?;
    }
    Ok(Bound { path: path.into(), listener: Some(listener), id: (meta.dev(), meta.ino()), _lock: lock, access })
}

impl Bound {
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve authorised requests to `calls`.
    pub fn serve(&mut self, calls: mpsc::Sender<Call>) {
        let Some(listener) = self.listener.take() else { return };
        let (access, big) = (self.access, Arc::new(Semaphore::new(1)));
        crate::listen::spawn("control socket", listener, MAX_CONNS, move |stream, conn| {
            serve(stream, conn, access, calls.clone(), Arc::clone(&big))
        });
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        // Only our own socket: another daemon may have replaced it since.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the peer is root or in the allowed group (primary or
/// supplementary, the latter read from /proc for the peer's pid).
fn authorised(stream: &UnixStream, access: Access) -> Result<Requester, Refused> {
    let cred = stream.peer_cred().map_err(Refused::Credentials)?;
    let by = Requester::Client { uid: cred.uid(), pid: cred.pid() };
    if cred.uid() == 0 {
        return Ok(by);
    }
    if let Some(gid) = access.gid {
        let in_group = cred.gid() == gid || cred.pid().is_some_and(|pid| supplementary_groups(pid).contains(&gid));
        if in_group {
            return Ok(by);
        }
    }
    Err(Refused::Peer { uid: cred.uid(), gid: access.gid })
}

/// Why a control client was refused.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("reading peer credentials: {0}")]
    Credentials(std::io::Error),
    #[error("permission denied: uid {uid} is not root and {}", gid.map_or_else(|| "no group is configured".to_owned(), |g| format!("not in group {g}")))]
    Peer { uid: u32, gid: Option<u32> },
}

fn supplementary_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default()
}

/// A connection is busy (never shed to make room for another) from a
/// complete request line until its answer is written; one that is idle or
/// still sending may be shed (a client sends a line in moments).
async fn serve(stream: UnixStream, conn: Conn, access: Access, calls: mpsc::Sender<Call>, big: Arc<Semaphore>) {
    let verdict = authorised(&stream, access);
    let (read, mut write) = stream.into_split();
    let by = match verdict {
        Ok(by) => by,
        Err(e) => {
            let _ = write_line(&mut write, &Response::error(ErrorCode::Denied, e.to_string())).await;
            return;
        }
    };
    let mut reader = BufReader::new(read);
    loop {
        let line = match tokio::time::timeout(READ_DEADLINE, read_line(&mut reader, &big)).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                let _ = write_line(&mut write, &Response::error(ErrorCode::BadRequest, e.to_string())).await;
                return;
            }
            Err(_) => {
                let message = format!("no complete request within {} s", READ_DEADLINE.as_secs());
                let _ = write_line(&mut write, &Response::error(ErrorCode::BadRequest, message)).await;
                return;
            }
        };
        let _busy = conn.busy();
        let response = match serde_json::from_slice::<Request>(&line) {
            Err(e) => Response::error(ErrorCode::BadRequest, format!("bad request: {e}")),
            Ok(req) => {
                drop(line);
                let (tx, rx) = Reply::new(by.clone());
                if calls.send((req, tx)).await.is_err() {
                    return;
                }
                rx.await.unwrap_or_else(|_| Response::error(ErrorCode::Unavailable, "daemon is shutting down"))
            }
        };
        if write_line(&mut write, &response).await.is_err() {
            return;
        }
    }
}

/// A request line that was not read.
#[derive(Debug, thiserror::Error)]
enum BadLine {
    #[error("reading the request: {0}")]
    Read(io::Error),
    #[error("the request ended without a newline")]
    Unterminated,
    #[error("request longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("another large request is being read; retry")]
    Busy,
}

/// One request line without its newline; `None` at a clean end of the
/// stream. Longer than [`SMALL_LINE`] needs the large-request slot; longer
/// than [`MAX_LINE`] is refused.
async fn read_line(
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    big: &Arc<Semaphore>,
) -> Result<Option<Vec<u8>>, BadLine> {
    let mut line = Vec::new();
    let mut permit = None;
    loop {
        let avail = r.fill_buf().await.map_err(BadLine::Read)?;
        if avail.is_empty() {
            return if line.is_empty() { Ok(None) } else { Err(BadLine::Unterminated) };
        }
        let (chunk, done) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (&avail[..i], true),
            None => (avail, false),
        };
        if line.len() + chunk.len() > MAX_LINE {
            return Err(BadLine::TooLong);
        }
        if line.len() + chunk.len() > SMALL_LINE && permit.is_none() {
            permit = Some(Arc::clone(big).try_acquire_owned().map_err(|_| BadLine::Busy)?);
        }
        line.extend_from_slice(chunk);
        let used = chunk.len() + usize::from(done);
        r.consume(used);
        if done {
            return Ok(Some(line));
        }
    }
}

async fn write_line(w: &mut OwnedWriteHalf, r: &Response) -> io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
    line.push(b'\n');
    match tokio::time::timeout(WRITE_DEADLINE, w.write_all(&line)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the client does not read its answer")),
    }
}
