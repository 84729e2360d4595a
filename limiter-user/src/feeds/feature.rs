//! The feed watcher: each `[[feed]]` file is watched (`crate::watch`:
//! looked at off the daemon's loop, read again when it changed or its
//! `refresh` is due), and a version that reads whole is sent to the
//! policy state as a change ([`FeedVersion`]); one that does not is
//! logged with where it failed, and the version in force stays.

use ipnet::IpNet;

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
    watch::Files,
};

impl crate::watch::Section for Feed {
    fn name(&self) -> &str {
        &self.name
    }
    fn path(&self) -> &std::path::Path {
        &self.path
    }
    fn refresh(&self) -> std::time::Duration {
        self.refresh
    }
}

/// Read `spec`'s file in its format.
fn read(spec: &Feed) -> Result<Parsed, FeedError> {
    super::read(&spec.path, spec.format, spec.min_count.unwrap_or(0), spec.allow_bogons)
}

/// Every feed of the policy in force.
#[derive(Debug)]
pub(crate) struct Feeds {
    files: Files<Feed, Parsed, FeedError, FeedReport>,
    sink: Sink,
}

impl Feeds {
    /// The watcher, which sends the versions it reads to `sink`.
    pub(crate) fn new(sink: Sink) -> Self {
        Self { files: Files::new(crate::policy::feed::MAX_FEEDS), sink }
    }

    /// Send each version read whole to the policy state (with the sink
    /// full, it is read again later); log one that did not read.
    fn reads_done(&mut self) {
        while let Some((w, read)) = self.files.read_back() {
            let name = &w.spec.name;
            match read {
                Ok(parsed) => {
                    w.state.reads += 1;
                    if parsed.refused_count > 0 {
                        let first = parsed.refused.first().map(|f| format!("; line {}: {} {}", f.line, f.net, f.why));
                        tracing::warn!(
                            event = "feed",
                            feed = %name,
                            "limiter: feed {name}: {} special-purpose network(s) left out (allow_bogons = false){}",
                            parsed.refused_count,
                            first.unwrap_or_default()
                        );
                    }
                    let version = Version {
                        origin: Named::feed(name),
                        section: w.watch.section(),
                        body: FeedVersion { spec: w.spec.clone(), nets: parsed.nets },
                    };
                    if self.sink.try_send(Decision::Source(Box::new(version))).is_err() {
                        w.watch.force();
                    }
                }
                Err(e) => {
                    w.state.read_errors += 1;
                    tracing::warn!(event = "feed", ok = false, feed = %name, "limiter: feed {name}: {e}; its last version stays");
                }
            }
        }
    }
}

impl Feature for Feeds {
    /// Exactly the policy's `[[feed]]` sections: an unchanged one keeps
    /// its state, a new or changed one is read at the next tick.
    fn apply(&mut self, a: &InForce<'_>) {
        self.files.follow(&a.policy.feeds, |spec| FeedReport { name: spec.name.clone(), ..FeedReport::default() });
    }

    /// SIGHUP: every feed is read again.
    fn reload(&mut self, _: &InForce<'_>) {
        self.files.force_all();
    }

    /// Send what was read, then look at each feed's file whose turn it
    /// is, off the loop.
    fn tick(&mut self, _: &Second<'_>) {
        self.reads_done();
        self.files.look(read);
    }

    /// The policy state refused or took a version of a feed.
    fn applied(&mut self, a: &mut Applied<'_>) {
        let Some(Named { by: Origin::Feed, name }) = a.origin() else { return };
        let ok = a.ok;
        if let Some(w) = self.files.get_mut(&name) {
            if ok {
                w.state.applied_at = crate::clock::unix_now();
            } else {
                w.state.refused += 1;
            }
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        let reports = self.files.iter().map(|w| FeedReport { shadow: w.spec.shadow, ..w.state.clone() });
        Some(Box::new(FeedReports(reports.collect())))
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
