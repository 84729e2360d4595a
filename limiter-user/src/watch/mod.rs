//! A file source that stamps, settles and re-reads: what every
//! file-backed source of decisions (feeds, groups, sources) shares. Each watched
//! file is looked at every [`CHECK`] off the daemon's loop (a blocking
//! task), and read when it changed (size, time, inode: a new download),
//! when its refresh is due, or when the daemon asks ([`Watch::force`]);
//! a file written to less than [`QUIET`] ago, or changed while it was
//! read, is not a version: it is read at the next check.

pub mod files;

pub use self::files::{Entry, Files, Section};

use std::{
    path::PathBuf,
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

/// How often each watched file is looked at.
pub const CHECK: Duration = Duration::from_secs(2);

/// A file written to less than this long ago is being written (a
/// download, an editor): read once it has been still this long. On
/// 394d35c a version read mid-write was taken, and the whole file after
/// it refused as a shrink.
pub const QUIET: Duration = Duration::from_secs(1);

/// What identifies a version of a file without reading it: modified
/// time, size, inode.
pub type Stamp = (SystemTime, u64, u64);

/// The stamp of the file at `path`, if it can be read.
#[must_use]
pub fn stamp_of(path: &std::path::Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Whether a file of `stamp` was still at `now` for [`QUIET`] (a time
/// in the future, a clock set back, counts as still).
#[must_use]
pub fn settled(stamp: &Stamp, now: SystemTime) -> bool {
    now.duration_since(stamp.0).map_or(true, |age| age >= QUIET)
}

/// One watched file's bookkeeping, kept on the loop.
#[derive(Debug)]
pub struct Watch {
    /// The stamp of the version last read whole.
    stamp: Option<Stamp>,
    last_read: Option<Instant>,
    last_check: Option<Instant>,
    /// Read again whatever the stamp says (a new section, SIGHUP, a
    /// version the sink had no room for).
    force: bool,
    /// A look is running off the loop.
    busy: Arc<AtomicBool>,
    /// Held while the section that names the file stands as it is: a
    /// version read under it and still waiting is dropped once it goes
    /// (removed or changed), so a removed source's networks never come
    /// back.
    section: Arc<()>,
}

impl Default for Watch {
    fn default() -> Self {
        Self::new()
    }
}

impl Watch {
    /// A file not read yet: read at the first check.
    #[must_use]
    pub fn new() -> Self {
        Self {
            stamp: None,
            last_read: None,
            last_check: None,
            force: true,
            busy: Arc::new(AtomicBool::new(false)),
            section: Arc::new(()),
        }
    }

    /// Read at the next check whatever the stamp says.
    pub fn force(&mut self) {
        self.force = true;
    }

    /// A look is running off the loop.
    #[must_use]
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// What a version read under the section in force holds on to (see
    /// [`Weak::strong_count`]).
    #[must_use]
    pub fn section(&self) -> Weak<()> {
        Arc::downgrade(&self.section)
    }

    /// A look came back: the next may start. Returns whether it gave a
    /// version to judge (`false`: being written, read again).
    pub fn back<T>(&mut self, looked: &Looked<T>) -> bool {
        self.busy.store(false, Ordering::Release);
        if looked.settling {
            self.force = true;
        }
        !looked.settling
    }

    /// The file was read (whole or not) and the version of `stamp`
    /// judged: it is not read again until it changes or `refresh` is due.
    pub fn read(&mut self, stamp: Option<Stamp>) {
        self.stamp = stamp;
        self.last_read = Some(Instant::now());
    }

    /// The file was read but gave nothing to keep: read again when due
    /// (the stamp of the version in force stays).
    pub fn failed(&mut self) {
        self.last_read = Some(Instant::now());
    }

    /// The file's turn at `now`, if it has one: none while a look runs or
    /// within [`CHECK`] of the last. A turn is due (read whatever the
    /// stamp says) when forced or `refresh` after the last read.
    pub fn turn(&mut self, now: Instant, refresh: Duration) -> Option<Turn> {
        if self.busy() || self.last_check.is_some_and(|t| now - t < CHECK) {
            return None;
        }
        self.last_check = Some(now);
        let due = std::mem::take(&mut self.force) || self.last_read.is_none_or(|t| now - t >= refresh);
        self.busy.store(true, Ordering::Release);
        Some(Turn { due, known: self.stamp, busy: self.busy.clone() })
    }
}

/// What a look at a file found: its stamp, what `read` gave (`None`: not
/// changed and not due, or being written), and whether it was being
/// written.
#[derive(Debug)]
pub struct Looked<T> {
    pub stamp: Option<Stamp>,
    pub result: Option<T>,
    pub settling: bool,
}

/// A file's turn to be looked at (see [`Watch::turn`]).
#[derive(Debug)]
pub struct Turn {
    due: bool,
    known: Option<Stamp>,
    busy: Arc<AtomicBool>,
}

impl Turn {
    /// Look at `path` now, on this thread: read it with `read` (given the
    /// stamp it is read at) if it changed or is due and has settled, and
    /// keep what was read only if the file did not change meanwhile.
    pub fn look<T>(&self, path: &std::path::Path, read: impl FnOnce(Option<Stamp>) -> T) -> Looked<T> {
        let stamp = stamp_of(path);
        let changed = stamp.is_some() && stamp != self.known;
        let wanted = self.due || changed;
        let mut settling = wanted && stamp.is_some_and(|s| !settled(&s, SystemTime::now()));
        let mut result = None;
        if wanted && !settling {
            let read = read(stamp);
            // Written to while it was read: not a version.
            if stamp_of(path) == stamp {
                result = Some(read);
            } else {
                settling = true;
            }
        }
        Looked { stamp, result, settling }
    }

    /// [`Turn::look`] off the loop (a blocking task); `send` hands what
    /// was found back to the loop, and returns whether it could (if not,
    /// the file is free for the next turn).
    pub fn spawn<T>(
        self,
        path: PathBuf,
        read: impl FnOnce(Option<Stamp>) -> T + Send + 'static,
        send: impl FnOnce(Looked<T>) -> bool + Send + 'static,
    ) {
        tokio::task::spawn_blocking(move || {
            let looked = self.look(&path, read);
            if !send(looked) {
                self.busy.store(false, Ordering::Release);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_to_within_the_quiet_time_is_not_read_yet() {
        let now = SystemTime::now();
        let at = |ago: Duration| (now - ago, 10, 1);
        assert!(!settled(&at(Duration::ZERO), now));
        assert!(!settled(&at(QUIET / 2), now));
        assert!(settled(&at(QUIET), now));
        assert!(settled(&at(Duration::from_hours(1)), now));
        // A time ahead of the clock (set back) does not hold it forever.
        assert!(settled(&(now + Duration::from_secs(5), 10, 1), now));
    }

    #[test]
    fn a_turn_comes_once_per_check_and_not_while_a_look_runs() {
        let mut w = Watch::new();
        let t0 = Instant::now();
        let turn = w.turn(t0, Duration::from_hours(1)).expect("a new file's first turn");
        assert!(turn.due, "a new file is read whatever its stamp");
        assert!(w.turn(t0 + CHECK * 2, Duration::from_hours(1)).is_none(), "a look runs");
        w.back(&Looked::<()> { stamp: None, result: None, settling: false });
        w.read(None);
        assert!(w.turn(t0 + CHECK / 2, Duration::from_hours(1)).is_none(), "within CHECK of the last");
        let next = w.turn(t0 + CHECK, Duration::from_hours(1)).expect("the next check");
        assert!(!next.due, "read, not forced, refresh not due");
        w.back(&Looked::<()> { stamp: None, result: None, settling: true });
        let again = w.turn(t0 + CHECK * 2, Duration::from_hours(1)).expect("the next check");
        assert!(again.due, "a file being written is read at the next check");
    }

    #[test]
    fn a_file_is_read_when_it_changes_and_not_when_it_does_not() {
        let dir = std::env::temp_dir().join(format!("limiter-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("list");
        std::fs::write(&path, "198.18.0.0/24\n").unwrap();
        // Settled: the file's time set back past the quiet time.
        let old = SystemTime::now() - QUIET * 2;
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
        let stamp = stamp_of(&path);
        let turn = |due, known| Turn { due, known, busy: Arc::new(AtomicBool::new(true)) };
        let read = |_| std::fs::read_to_string(&path).unwrap();
        assert_eq!(turn(false, stamp).look(&path, read).result, None, "unchanged, not due");
        assert_eq!(turn(true, stamp).look(&path, read).result.as_deref(), Some("198.18.0.0/24\n"), "due");
        // A new version, just written: not read until it settles.
        std::fs::write(&path, "198.18.1.0/24\n198.18.2.0/24\n").unwrap();
        let fresh = turn(false, stamp).look(&path, read);
        assert!(fresh.settling && fresh.result.is_none(), "{fresh:?}");
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
        let changed = turn(false, stamp).look(&path, read);
        assert_eq!(changed.result.as_deref(), Some("198.18.1.0/24\n198.18.2.0/24\n"), "changed and settled");
        assert_ne!(changed.stamp, stamp);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
