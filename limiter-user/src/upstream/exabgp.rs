//! ExaBGP's command pipes, as its own CLI uses them: ExaBGP started with
//! `exabgp.api.cli = true` and `exabgp.api.pipename = NAME` reads one
//! command a line from `DIR/NAME.in` and writes its answer to
//! `DIR/NAME.out`, ending with `done` or `error`. Both must be named
//! pipes (made with `mkfifo -m 600`); an answer longer than
//! [`MAX_ANSWER`] or slower than the deadline is an error, and the
//! speaker's being down (nobody reading its pipe) is one at once, never
//! a wait.

use std::{
    fs::{File, OpenOptions},
    io::{ErrorKind, Read as _, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The most an answer may be (`show adj-rib out` of 10,000 rules is
/// about 1.5 MB).
pub const MAX_ANSWER: usize = 4 << 20;

/// Why a command got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    #[error("the speaker is not running (nobody reads {0})")]
    Down(PathBuf),
    #[error("{0} is not a named pipe")]
    NotAPipe(PathBuf),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("an answer longer than {MAX_ANSWER} bytes")]
    TooLong,
    #[error("the speaker refused the command")]
    Refused,
}

/// The daemon's end of ExaBGP's pipes.
#[derive(Debug)]
pub struct Pipe {
    base: PathBuf,
    /// `NAME.out`, held open for reading: ExaBGP opens it for each answer
    /// and drops an answer nobody reads.
    out: Option<File>,
}

impl Pipe {
    /// The pipes at `base` (`base.in`, `base.out`); nothing is opened yet.
    #[must_use]
    pub fn new(base: &Path) -> Self {
        Self { base: base.to_owned(), out: None }
    }

    fn path(&self, ext: &str) -> PathBuf {
        let mut p = self.base.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    }

    fn open(path: &Path, write: bool) -> Result<File, PipeError> {
        let meta = std::fs::metadata(path).map_err(|e| PipeError::Io(path.to_owned(), e))?;
        if !meta.file_type().is_fifo() {
            return Err(PipeError::NotAPipe(path.to_owned()));
        }
        OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENXIO) => PipeError::Down(path.to_owned()),
                _ => PipeError::Io(path.to_owned(), e),
            })
    }

    /// Send `command` (one line) and read its answer until `done`, within
    /// `deadline`: the answer's lines, or why not. After an error the
    /// answer pipe is opened again (a speaker started again may have made
    /// new pipes).
    pub fn ask(&mut self, command: &str, deadline: Duration) -> Result<String, PipeError> {
        let r = self.exchange(command, deadline);
        if r.as_ref().is_err_and(|e| !matches!(e, PipeError::Refused)) {
            self.out = None;
        }
        r
    }

    fn exchange(&mut self, command: &str, deadline: Duration) -> Result<String, PipeError> {
        use std::os::unix::fs::MetadataExt as _;
        debug_assert!(!command.contains('\n'));
        // The pipe at the path is no longer the one held: made again.
        let held = self.out.as_ref().and_then(|f| f.metadata().ok()).map(|m| (m.dev(), m.ino()));
        let now = std::fs::metadata(self.path(".out")).ok().map(|m| (m.dev(), m.ino()));
        if held.is_some() && held != now {
            self.out = None;
        }
        if self.out.is_none() {
            self.out = Some(Self::open(&self.path(".out"), false)?);
        }
        let (out_path, in_path) = (self.path(".out"), self.path(".in"));
        let Some(out) = self.out.as_mut() else { unreachable!("opened above") };
        // What an earlier command left (an answer past its deadline).
        let mut scratch = [0u8; 4096];
        while matches!(out.read(&mut scratch), Ok(n) if n > 0) {}
        let mut input = Self::open(&in_path, true)?;
        input.write_all(format!("{command}\n").as_bytes()).map_err(|e| PipeError::Io(in_path, e))?;
        drop(input);
        let start = Instant::now();
        let mut answer = Vec::new();
        loop {
            if answer.ends_with(b"done\n") {
                answer.truncate(answer.len() - 5);
                return Ok(String::from_utf8_lossy(&answer).into_owned());
            }
            if answer.ends_with(b"error\n") {
                return Err(PipeError::Refused);
            }
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(PipeError::Timeout(deadline));
            }
            let mut fd = libc::pollfd { fd: out.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = i32::try_from(left.as_millis().clamp(1, 100)).unwrap_or(100);
            // SAFETY: one valid pollfd, for the call's duration.
            unsafe { libc::poll(&raw mut fd, 1, ms) };
            match out.read(&mut scratch) {
                Ok(0) => std::thread::sleep(Duration::from_millis(5)),
                Ok(n) => {
                    answer.extend_from_slice(&scratch[..n]);
                    if answer.len() > MAX_ANSWER {
                        return Err(PipeError::TooLong);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(PipeError::Io(out_path, e)),
            }
        }
    }
}

/// What `show neighbor summary` says: each neighbour and whether its
/// session is established.
#[must_use]
pub fn neighbours(summary: &str) -> Vec<(String, bool)> {
    summary
        .lines()
        .filter(|l| !l.starts_with("Peer"))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let peer = f.next()?;
            peer.parse::<std::net::IpAddr>().ok()?;
            let up = f.any(|w| w.eq_ignore_ascii_case("established"));
            Some((peer.to_owned(), up))
        })
        .take(64)
        .collect()
}

/// The routes `show adj-rib out` lists, each once (a route is listed once
/// per neighbour).
#[must_use]
pub fn routes(adj_rib_out: &str) -> usize {
    let mut seen: Vec<&str> = adj_rib_out
        .lines()
        .filter_map(|l| l.strip_prefix("neighbor ")?.split_once(' ').map(|(_, route)| route.trim()))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ExaBGP 4.2's own answers (Debian 12's 4.2.21).
    #[test]
    fn the_speakers_answers_are_read() {
        let summary = "Peer            AS        up/down state       |     #sent     #recvd\n\
                       198.18.70.2     64501     0:00:14 established           7          4\n\
                       198.18.70.6     64502        down active               0          0\n";
        assert_eq!(neighbours(summary), vec![("198.18.70.2".into(), true), ("198.18.70.6".into(), false)]);
        let rib = "neighbor 198.18.70.2 ipv4 flow flow source-ipv4 198.18.81.0/24\n\
                   neighbor 198.18.70.6 ipv4 flow flow source-ipv4 198.18.81.0/24\n\
                   neighbor 198.18.70.2 ipv6 flow flow source-ipv6 2001:2:80::/48/0\n";
        assert_eq!(routes(rib), 2);
    }

    /// A path that is not a pipe, and a pipe nobody reads, are errors at
    /// once.
    #[test]
    fn no_speaker_is_an_error_not_a_wait() {
        let dir = std::env::temp_dir().join(format!("limiter-pipe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("x");
        std::fs::write(dir.join("x.out"), "done\n").unwrap();
        let e = Pipe::new(&base).ask("show neighbor summary", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, PipeError::NotAPipe(_)), "{e}");
        std::fs::remove_file(dir.join("x.out")).unwrap();
        for ext in ["x.in", "x.out"] {
            let c = std::ffi::CString::new(dir.join(ext).into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        let e = Pipe::new(&base).ask("show neighbor summary", Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, PipeError::Down(_)), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
