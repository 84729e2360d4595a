//! Listening side of the control socket.

use std::{
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};

use super::{Request, Response};

/// A request from a client, with the channel for its answer.
pub type Call = (Request, oneshot::Sender<Response>);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("creating the socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
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

/// Bind `path` with mode 0660 (group `access.gid` if any) and forward
/// authorised requests to `calls`. A stale socket file is replaced.
pub fn listen(path: &Path, access: Access, calls: mpsc::Sender<Call>) -> Result<(), ServerError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::Dir { path: dir.into(), source })?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|source| ServerError::Bind { path: path.into(), source })?;
    let perms = |source| ServerError::Perms { path: path.into(), source };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(perms)?;
    // Created with our own group already when systemd runs us with
    // `Group=`; chown (which needs CAP_CHOWN) only when it differs.
    if let Some(gid) = access.gid {
        use std::os::unix::fs::MetadataExt as _;
        if std::fs::metadata(path).map_err(perms)?.gid() != gid {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(perms)?;
        }
    }
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, access, calls.clone()));
        }
    });
    Ok(())
}

/// Whether the peer is root or in the allowed group (primary or
/// supplementary, the latter read from /proc for the peer's pid).
fn authorised(stream: &UnixStream, access: Access) -> Result<(), String> {
    let cred = stream.peer_cred().map_err(|e| format!("reading peer credentials: {e}"))?;
    if cred.uid() == 0 {
        return Ok(());
    }
    if let Some(gid) = access.gid {
        let in_group = cred.gid() == gid || cred.pid().is_some_and(|pid| supplementary_groups(pid).contains(&gid));
        if in_group {
            return Ok(());
        }
    }
    let group = access.gid.map_or_else(|| "no group is configured".to_owned(), |g| format!("not in group {g}"));
    Err(format!("permission denied: uid {} is not root and {group}", cred.uid()))
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

async fn serve(stream: UnixStream, access: Access, calls: mpsc::Sender<Call>) {
    let verdict = authorised(&stream, access);
    let (read, mut write) = stream.into_split();
    if let Err(message) = verdict {
        let _ = write_line(&mut write, &Response::Error { message }).await;
        return;
    }
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let response = match serde_json::from_str::<Request>(&line) {
            Err(e) => Response::Error { message: format!("bad request: {e}") },
            Ok(req) => {
                let (tx, rx) = oneshot::channel();
                if calls.send((req, tx)).await.is_err() {
                    return;
                }
                rx.await.unwrap_or(Response::Error { message: "daemon is shutting down".into() })
            }
        };
        if write_line(&mut write, &response).await.is_err() {
            return;
        }
    }
}

async fn write_line(w: &mut tokio::net::unix::OwnedWriteHalf, r: &Response) -> io::Result<()> {
    let mut line = serde_json::to_string(r).map_err(io::Error::other)?;
    line.push('\n');
    w.write_all(line.as_bytes()).await
}
