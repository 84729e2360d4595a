//! Asking the daemon over the control socket: one typed call per request.

use std::{
    io::{self, BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Applied, PolicyText, PrefixList, Request, Response, StatsInfo, StatusInfo, TopInfo};

/// How long a client waits for the daemon's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {path} (is `limiter run` running?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the daemon at {path} did not answer within {} s", .after.as_secs_f64())]
    Timeout { path: PathBuf, after: Duration },
    #[error("talking to the daemon at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the daemon at {path} closed the connection without an answer: its clients are all busy ({} at most, {} per user) or it is stopping; try again",
        super::server::MAX_CONNS,
        super::server::MAX_CONNS / 4
    )]
    Closed { path: PathBuf },
    #[error("the daemon's answer is not valid: {0}")]
    Decode(#[from] serde_json::Error),
    /// The daemon's refusal (`entry`: the refused entry of a bulk load).
    #[error("{}{message}", entry.map(|i| format!("entry {i}: ")).unwrap_or_default())]
    Refused { code: super::ErrorCode, message: String, entry: Option<usize> },
    #[error("the daemon answered {got} to {asked}")]
    Unexpected { asked: &'static str, got: &'static str },
}

/// A client of the daemon at one socket path.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    path: &'a Path,
}

impl<'a> Client<'a> {
    #[must_use]
    pub fn new(path: &'a Path) -> Self {
        Self { path }
    }

    /// Send `req` and keep the answer `pick` accepts; anything else is
    /// [`ClientError::Unexpected`].
    fn ask<T>(&self, asked: &'static str, req: &Request, pick: fn(Response) -> Option<T>) -> Result<T, ClientError> {
        let r = call(self.path, req)?;
        let got = r.kind();
        pick(r).ok_or(ClientError::Unexpected { asked, got })
    }

    pub fn status(&self) -> Result<StatusInfo, ClientError> {
        self.ask("status", &Request::Status, |r| if let Response::Status(s) = r { Some(s) } else { None })
    }

    pub fn stats(&self) -> Result<StatsInfo, ClientError> {
        self.ask("stats", &Request::Stats, |r| if let Response::Stats(s) = r { Some(s) } else { None })
    }

    pub fn policy_show(&self) -> Result<PolicyText, ClientError> {
        self.ask("policy show", &Request::PolicyShow, |r| if let Response::Policy(p) = r { Some(p) } else { None })
    }

    pub fn prefix_list(&self) -> Result<PrefixList, ClientError> {
        self.ask("prefix list", &Request::PrefixList, |r| if let Response::Prefixes(p) = r { Some(p) } else { None })
    }

    pub fn fleet_status(&self) -> Result<Option<crate::fleet::FleetStatus>, ClientError> {
        self.ask("fleet status", &Request::FleetStatus, |r| {
            if let Response::Fleet { status } = r { Some(status) } else { None }
        })
    }

    /// `limiter history`: the changes since `since` (Unix time), at most
    /// `limit`.
    pub fn history(&self, since: Option<u64>, limit: usize) -> Result<super::History, ClientError> {
        let req = Request::History { since, limit };
        self.ask("history", &req, |r| if let Response::History(h) = r { Some(h) } else { None })
    }

    /// `limiter capture`: open, read or close a tap.
    pub fn capture(&self, req: &Request) -> Result<super::Captured, ClientError> {
        self.ask("capture", req, |r| if let Response::Captured(c) = r { Some(c) } else { None })
    }

    /// `limiter attacks`: the last `limit` attacks, or the one `id`.
    pub fn attacks(&self, id: Option<u64>, limit: usize) -> Result<super::Attacks, ClientError> {
        let req = Request::Attacks { id, limit };
        self.ask("attacks", &req, |r| if let Response::Attacks(a) = r { Some(a) } else { None })
    }

    /// `limiter explain`.
    pub fn explain(
        &self,
        addr: std::net::IpAddr,
        protocol: crate::policy::Protocol,
        port: Option<u16>,
        syn: bool,
    ) -> Result<super::Explain, ClientError> {
        let req = Request::Explain { addr, protocol, port, syn };
        self.ask("explain", &req, |r| if let Response::Explain(e) = r { Some(*e) } else { None })
    }

    pub fn prefix_show(&self, cidr: ipnet::IpNet) -> Result<super::PrefixShow, ClientError> {
        let req = Request::PrefixShow { cidr };
        self.ask("prefix show", &req, |r| if let Response::PrefixShow(p) = r { Some(p) } else { None })
    }

    pub fn top(&self, n: usize) -> Result<TopInfo, ClientError> {
        self.ask("top", &Request::Top { n }, |r| if let Response::Top(t) = r { Some(t) } else { None })
    }

    /// `limiter upstream ...`: the rules after the request.
    pub fn upstream(&self, req: &Request) -> Result<crate::upstream::UpstreamInfo, ClientError> {
        self.ask("upstream", req, |r| if let Response::Upstream(u) = r { Some(u) } else { None })
    }

    pub fn tunnels(&self, req: &Request) -> Result<crate::tunnel::TunnelsInfo, ClientError> {
        self.ask("tunnels", req, |r| if let Response::Tunnels(t) = r { Some(t) } else { None })
    }

    /// A request that makes a new policy version (`policy apply`, `prefix
    /// set|allow|deny|unset`).
    pub fn change(&self, req: &Request) -> Result<Applied, ClientError> {
        self.ask("a policy change", req, |r| if let Response::Applied(a) = r { Some(a) } else { None })
    }
}

/// Send one request and wait for its answer. A daemon-side error becomes
/// [`ClientError::Refused`].
pub fn call(path: &Path, req: &Request) -> Result<Response, ClientError> {
    call_within(path, req, ANSWER_TIMEOUT)
}

fn call_within(path: &Path, req: &Request, after: Duration) -> Result<Response, ClientError> {
    let io_err = |source: io::Error| match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout { path: path.into(), after },
        // Closed at accept: the daemon is at its cap of connections.
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => {
            ClientError::Closed { path: path.into() }
        }
        _ => ClientError::Io { path: path.into(), source },
    };
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect { path: path.into(), source })?;
    s.set_read_timeout(Some(after)).map_err(io_err)?;
    s.set_write_timeout(Some(after)).map_err(io_err)?;
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
        Response::Error { code, message, entry } => Err(ClientError::Refused { code, message, entry }),
        r => Ok(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_never_answers_is_reported_as_such() {
        let dir = std::env::temp_dir().join(format!("limiter-client-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("mute.sock");
        let _ = std::fs::remove_file(&path);
        // Accepts, reads, never answers.
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let e = call_within(&path, &Request::Status, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.to_string(), format!("the daemon at {} did not answer within 0.3 s", path.display()));
        drop(held.join());
        // One that closes at once (at its cap): said so, not "Broken pipe".
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let closer = std::thread::spawn(move || drop(listener.accept()));
        let e = call_within(&path, &Request::Status, Duration::from_secs(5)).unwrap_err();
        closer.join().unwrap();
        assert!(
            e.to_string().contains("closed the connection without an answer") && e.to_string().contains("try again"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
