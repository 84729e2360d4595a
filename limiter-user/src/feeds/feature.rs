//! The feed watcher: each `[[feed]]` file is watched (`crate::watch`:
//! looked at off the daemon's loop, read again when it changed or its
//! `refresh` is due), and a version that reads whole is sent to the
//! policy state as a change ([`FeedVersion`]); one that does not is
//! logged with where it failed, and the version in force stays.

use std::time::Instant;

use ipnet::IpNet;
use tokio::sync::mpsc;

use super::{FeedError, FeedReport, FeedReports, Parsed};
use crate::engine::{
    ApplyError, Enforcer,
    decision::{Decision, Sink},
    feature::{Applied, Feature, InForce, Second},
    source::{Version, VersionOf},
};
use crate::{
    dataplane::maps::Tables,
    origin::{Named, Origin},
    policy::feed::Feed,
    series::Series,
    watch::{Looked, Watch},
};

/// A feed's file looked at.
#[derive(Debug)]
struct FeedRead {
    spec: Feed,
    looked: Looked<Result<Parsed, FeedError>>,
}

#[derive(Debug)]
struct Watched {
    spec: Feed,
    watch: Watch,
    report: FeedReport,
}

/// Every feed of the policy in force.
#[derive(Debug)]
pub(crate) struct Feeds {
    watched: Vec<Watched>,
    /// Where the reads off the loop come back (taken at each tick).
    tx: mpsc::Sender<FeedRead>,
    rx: mpsc::Receiver<FeedRead>,
    sink: Sink,
}

impl Feeds {
    /// The watcher, which sends the versions it reads to `sink`.
    pub(crate) fn new(sink: Sink) -> Self {
        let (tx, rx) = mpsc::channel(crate::policy::feed::MAX_FEEDS);
        Self { watched: Vec::new(), tx, rx, sink }
    }

    /// A read came back: note it, and send the version it read whole to
    /// the policy state (with the sink full, it is read again later).
    fn read_done(&mut self, r: FeedRead) {
        let Some(w) = self.watched.iter_mut().find(|w| w.spec.name == r.spec.name) else { return };
        if !w.watch.back(&r.looked) || w.spec != r.spec {
            // The file is being written, or the section changed while it
            // was read: read again.
            w.watch.force();
            return;
        }
        match r.looked.result {
            None => {}
            Some(Ok(parsed)) => {
                w.watch.read(r.looked.stamp);
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
                let version = Version {
                    origin: Named::feed(&w.spec.name),
                    section: w.watch.section(),
                    body: FeedVersion { spec: w.spec.clone(), nets: parsed.nets },
                };
                if self.sink.try_send(Decision::Source(Box::new(version))).is_err() {
                    w.watch.force();
                }
            }
            Some(Err(e)) => {
                w.watch.failed();
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
                    watch: Watch::new(),
                    report: FeedReport { name: spec.name.clone(), ..FeedReport::default() },
                }),
            }
        }
        self.watched = next;
    }

    /// SIGHUP: every feed is read again.
    fn reload(&mut self, _: &InForce<'_>) {
        for w in &mut self.watched {
            w.watch.force();
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
            let Some(turn) = w.watch.turn(now, w.spec.refresh) else { continue };
            let (spec, tx) = (w.spec.clone(), self.tx.clone());
            let path = spec.path.clone();
            let (format, min, bogons) = (spec.format, spec.min_count.unwrap_or(0), spec.allow_bogons);
            let read = move |_| super::read(&path, format, min, bogons);
            turn.spawn(w.spec.path.clone(), read, move |looked| tx.blocking_send(FeedRead { spec, looked }).is_ok());
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
    spec: Feed,
    nets: std::collections::BTreeSet<IpNet>,
}

impl VersionOf for FeedVersion {
    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        state.deny_mut().feed(tables, &self.spec, &self.nets)
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        let feed = &self.spec.name;
        match result {
            Ok(line) => tracing::info!(event = "feed", ok = true, feed = %feed, "limiter: {line}"),
            Err(e) => tracing::warn!(event = "feed", ok = false, feed = %feed, "limiter: {e}"),
        }
    }
}
