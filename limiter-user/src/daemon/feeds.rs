//! The feed watcher: each `[[feed]]` file is looked at every
//! [`CHECK`] off the daemon's loop (a blocking task), read again when it
//! changed (size, time, inode: a new download) or its `refresh` is due,
//! and a version that reads whole is sent to the policy state as a
//! change ([`FeedVersion`]); one that does not is logged with where it
//! failed, and the version in force stays.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use ipnet::IpNet;
use tokio::sync::mpsc;

use super::{
    ApplyError, Enforcer,
    decision::{Decision, Sink},
    feature::{Applied, Feature, InForce, Second},
    source::SourceChange,
};
use crate::{
    dataplane::maps::Tables,
    feeds::{FeedError, FeedReport, FeedReports, Parsed},
    origin::{Named, Origin},
    policy::feed::Feed,
    series::Series,
};

/// How often each feed's file is looked at.
pub(super) const CHECK: Duration = Duration::from_secs(2);

/// What identifies a version of a file without reading it.
pub(super) type Stamp = (SystemTime, u64, u64);

/// A file written to less than this long ago is being written (a
/// download, an editor): read once it has been still this long. On
/// 394d35c a version read mid-write was taken, and the whole file after
/// it refused as a shrink.
pub const QUIET: Duration = Duration::from_secs(1);

/// Whether a file of `stamp` was still at `now` for [`QUIET`] (a time
/// in the future, a clock set back, counts as still).
pub(super) fn settled(stamp: &Stamp, now: SystemTime) -> bool {
    now.duration_since(stamp.0).map_or(true, |age| age >= QUIET)
}

/// A feed's file looked at: read (`Some`) when it changed or was due.
#[derive(Debug)]
struct FeedRead {
    pub spec: Feed,
    pub stamp: Option<Stamp>,
    pub result: Option<Result<Parsed, FeedError>>,
    /// It was due but being written (or changed while it was read): read
    /// at the next check.
    pub settling: bool,
}

#[derive(Debug)]
struct Watched {
    spec: Feed,
    /// The stamp of the version last read whole.
    stamp: Option<Stamp>,
    last_read: Option<Instant>,
    last_check: Option<Instant>,
    /// Read again whatever the stamp says (a new section, SIGHUP).
    force: bool,
    busy: Arc<AtomicBool>,
    report: FeedReport,
    /// Held while the section stands as it is: a version read under it
    /// and still waiting is dropped once it goes (removed or changed),
    /// so a removed feed's networks never come back.
    section: Arc<()>,
}

/// Every feed of the policy in force.
#[derive(Debug)]
pub(super) struct Feeds {
    watched: Vec<Watched>,
    /// Where the reads off the loop come back (taken at each tick).
    tx: mpsc::Sender<FeedRead>,
    rx: mpsc::Receiver<FeedRead>,
    sink: Sink,
}

impl Feeds {
    /// The watcher, which sends the versions it reads to `sink`.
    pub(super) fn new(sink: Sink) -> Self {
        let (tx, rx) = mpsc::channel(crate::policy::feed::MAX_FEEDS);
        Self { watched: Vec::new(), tx, rx, sink }
    }

    /// A read came back: note it, and send the version it read whole to
    /// the policy state (with the sink full, it is read again later).
    fn read_done(&mut self, r: FeedRead) {
        let Some(w) = self.watched.iter_mut().find(|w| w.spec.name == r.spec.name) else { return };
        w.busy.store(false, Ordering::Release);
        if w.spec != r.spec || r.settling {
            // The section changed while it was read, or the file is being
            // written: read again.
            w.force = true;
            return;
        }
        match r.result {
            None => {}
            Some(Ok(parsed)) => {
                w.stamp = r.stamp;
                w.last_read = Some(Instant::now());
                w.report.reads += 1;
                if parsed.refused_count > 0 {
                    let first = parsed.refused.first().map(|f| format!("; line {}: {} {}", f.line, f.net, f.why));
                    tracing::warn!(
                        event = "feed",
                        feed = %w.spec.name,
                        "limiter: feed {}: {} special-purpose network(s) left out (allow_bogons = false){}",
                        w.spec.name,
                        parsed.refused_count,
                        first.unwrap_or_default()
                    );
                }
                let version = FeedVersion {
                    source: Named::feed(&w.spec.name),
                    spec: w.spec.clone(),
                    nets: parsed.nets,
                    section: Arc::downgrade(&w.section),
                };
                if self.sink.try_send(Decision::Source(Box::new(version))).is_err() {
                    w.force = true;
                }
            }
            Some(Err(e)) => {
                w.last_read = Some(Instant::now());
                w.report.read_errors += 1;
                tracing::warn!(event = "feed", ok = false, feed = %w.spec.name, "limiter: feed {}: {e}; its last version stays", w.spec.name);
            }
        }
    }

    /// Each feed's report.
    fn reports(&self) -> Vec<FeedReport> {
        self.watched.iter().map(|w| FeedReport { shadow: w.spec.shadow, ..w.report.clone() }).collect()
    }
}

impl Feature for Feeds {
    /// Exactly the policy's `[[feed]]` sections: an unchanged one keeps
    /// its state, a new or changed one is read at the next tick.
    fn apply(&mut self, a: &InForce<'_>) {
        let mut next = Vec::with_capacity(a.policy.feeds.len());
        for spec in &a.policy.feeds {
            match self.watched.iter().position(|w| w.spec == *spec) {
                Some(i) => next.push(self.watched.swap_remove(i)),
                None => next.push(Watched {
                    spec: spec.clone(),
                    stamp: None,
                    last_read: None,
                    last_check: None,
                    force: true,
                    busy: Arc::new(AtomicBool::new(false)),
                    report: FeedReport { name: spec.name.clone(), ..FeedReport::default() },
                    section: Arc::new(()),
                }),
            }
        }
        self.watched = next;
    }

    /// SIGHUP: every feed is read again.
    fn reload(&mut self, _: &InForce<'_>) {
        for w in &mut self.watched {
            w.force = true;
        }
    }

    /// Send what was read, then look at each feed's file whose turn it
    /// is, off the loop.
    fn tick(&mut self, _: &Second<'_>) {
        while let Ok(read) = self.rx.try_recv() {
            self.read_done(read);
        }
        let now = Instant::now();
        for w in &mut self.watched {
            if w.busy.load(Ordering::Acquire) || w.last_check.is_some_and(|t| now - t < CHECK) {
                continue;
            }
            w.last_check = Some(now);
            let due = std::mem::take(&mut w.force) || w.last_read.is_none_or(|t| now - t >= w.spec.refresh);
            let (spec, known, tx, busy) = (w.spec.clone(), w.stamp, self.tx.clone(), w.busy.clone());
            busy.store(true, Ordering::Release);
            tokio::task::spawn_blocking(move || {
                let stamp = stamp_of(&spec.path);
                let changed = stamp.is_some() && stamp != known;
                let mut settling = (due || changed) && stamp.is_some_and(|s| !settled(&s, SystemTime::now()));
                let mut result = None;
                if (due || changed) && !settling {
                    let read =
                        crate::feeds::read(&spec.path, spec.format, spec.min_count.unwrap_or(0), spec.allow_bogons);
                    // Written to while it was read: not a version.
                    if stamp_of(&spec.path) == stamp {
                        result = Some(read);
                    } else {
                        settling = true;
                    }
                }
                if tx.blocking_send(FeedRead { spec, stamp, result, settling }).is_err() {
                    busy.store(false, Ordering::Release);
                }
            });
        }
    }

    /// The policy state refused or took a version of a feed.
    fn applied(&mut self, a: &mut Applied<'_>) {
        let Some(Named { by: Origin::Feed, name }) = a.origin() else { return };
        let ok = a.ok;
        if let Some(w) = self.watched.iter_mut().find(|w| w.spec.name == name) {
            if ok {
                w.report.applied_at = crate::clock::unix_now();
            } else {
                w.report.refused += 1;
            }
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(FeedReports(self.reports())))
    }
}

/// A version of a feed, read whole: the deny set takes the diff.
#[derive(Debug)]
struct FeedVersion {
    /// `feed:NAME`.
    source: Named,
    spec: Feed,
    nets: std::collections::BTreeSet<IpNet>,
    /// The section it was read under (see `Watched::section`).
    section: std::sync::Weak<()>,
}

impl SourceChange for FeedVersion {
    fn origin(&self) -> Named {
        self.source.clone()
    }

    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        state.deny_mut().feed(tables, &self.spec, &self.nets)
    }

    fn parts(self: Box<Self>) -> Vec<Box<dyn SourceChange>> {
        vec![self]
    }

    /// Its section still stands as it was read under.
    fn current(&self) -> bool {
        self.section.strong_count() > 0
    }

    /// A newer version of the same feed.
    fn replaces(&self, waiting: &dyn SourceChange) -> bool {
        waiting.origin() == self.source
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        let feed = &self.spec.name;
        match result {
            Ok(line) => tracing::info!(event = "feed", ok = true, feed = %feed, "limiter: {line}"),
            Err(e) => tracing::warn!(event = "feed", ok = false, feed = %feed, "limiter: {e}"),
        }
    }
}

/// The stamp of the file at `path`, if it can be read.
pub(super) fn stamp_of(path: &std::path::Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_waiting_when_its_section_goes_is_dropped() {
        let section = Arc::new(());
        let spec: Feed = toml::from_str("name = \"x\"\npath = \"/x\"\n").unwrap();
        let v = FeedVersion {
            source: Named::feed("x"),
            spec,
            nets: std::collections::BTreeSet::new(),
            section: Arc::downgrade(&section),
        };
        assert!(v.current());
        drop(section);
        assert!(!v.current(), "a version of a removed or changed section would be applied");
    }

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
}
