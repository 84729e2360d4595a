//! Asking the daemon over the control socket.

use std::{
    io::{self, BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Request, Response};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {path} (is `limiter run` running?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("talking to the daemon at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the daemon's answer is not valid: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("{0}")]
    Refused(String),
}

/// Send one request and wait for its answer. A daemon-side error becomes
/// [`ClientError::Refused`].
pub fn call(path: &Path, req: &Request) -> Result<Response, ClientError> {
    let io_err = |source| ClientError::Io { path: path.into(), source };
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect { path: path.into(), source })?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(io_err)?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    // A daemon that refuses a peer answers at once and closes; the write
    // may then fail with EPIPE while the refusal waits to be read.
    let written = s.write_all(line.as_bytes());
    let mut answer = String::new();
    let read = BufReader::new(&s).read_line(&mut answer);
    match (written, read) {
        (_, Ok(n)) if n > 0 => {}
        (Err(e), _) | (Ok(()), Err(e)) => return Err(io_err(e)),
        (Ok(()), Ok(_)) => return Err(io_err(io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"))),
    }
    match serde_json::from_str::<Response>(&answer)? {
        Response::Error { message } => Err(ClientError::Refused(message)),
        r => Ok(r),
    }
}
