//! The sources' watcher: each `[[source]]` file is watched
//! (`crate::watch`: looked at off the daemon's loop, read again when it
//! changed or its `refresh` is due), read by its kind, and a version that
//! reads whole is sent to the policy state as a change ([`SourceVersion`]),
//! which checks it and puts it in the sources' layer; one that does not
//! is logged with where it failed, and the version in force stays.

use std::collections::BTreeSet;

use ipnet::IpNet;
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{Refused, section::Source};
use crate::engine::{
    ApplyError, Enforcer,
    decision::{Decision, Sink},
    feature::{Applied, Feature, InForce, Second},
    source::{Version, VersionOf},
};
use crate::{
    dataplane::maps::Tables,
    origin::{Named, Origin},
    series::{Series, clamp},
    watch::Files,
};

/// Largest source file read (100,000 networks as text with comments).
pub const MAX_FILE: u64 = 16 << 20;

/// Why a source's file gave no version.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    File(#[from] crate::policy::file::ReadError),
    #[error("{0}")]
    Kind(#[from] Refused),
}

/// Read `spec`'s file with its kind.
fn read(spec: &Source) -> Result<BTreeSet<IpNet>, ReadError> {
    let text = crate::policy::file::read_text(&spec.path, MAX_FILE, "a source")?;
    let kind = super::kind(&spec.kind).ok_or_else(|| Refused { line: 0, why: format!("no kind {}", spec.kind) })?;
    Ok((kind.read)(&text)?)
}

/// The daemon's start: each `[[source]]` of `policy` read now, before
/// its first policy is applied, so that a restart applies the sources'
/// networks with it (the pinned program enforced them until then); what
/// does not read is logged and read again by the watcher.
pub(crate) fn read_first(state: &mut Enforcer, policy: &crate::policy::Policy) {
    for spec in &policy.sources {
        let (name, path) = (&spec.name, spec.path.display());
        match read(spec).map_err(|e| e.to_string()).and_then(|nets| state.source_first(spec, nets)) {
            Ok(n) => {
                tracing::info!(event = "source", ok = true, source = %name, "limiter: source {name}: {n} networks read at start");
            }
            Err(e) => {
                tracing::warn!(event = "source", ok = false, source = %name, "limiter: source {name}: {path}: {e}; read again later");
            }
        }
    }
}

/// How one source reads.
#[derive(Clone, Debug, Default)]
struct Report {
    name: String,
    kind: String,
    /// Versions read whole and sent, failed reads, versions refused.
    reads: u64,
    read_errors: u64,
    refused: u64,
    /// Networks of the version in force.
    networks: usize,
}

impl crate::watch::Section for Source {
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

/// Every source of the policy in force.
#[derive(Debug)]
pub(crate) struct Sources {
    files: Files<Source, BTreeSet<IpNet>, ReadError, Report>,
    sink: Sink,
}

impl Sources {
    /// The watcher, which sends the versions it reads to `sink`.
    pub(crate) fn new(sink: Sink) -> Self {
        Self { files: Files::new(super::section::MAX_SOURCES), sink }
    }

    /// Send each version read whole to the policy state (with the sink
    /// full, it is read again later); log one that did not read.
    fn reads_done(&mut self) {
        while let Some((w, read)) = self.files.read_back() {
            match read {
                Ok(nets) => {
                    w.state.reads += 1;
                    let version = Version {
                        origin: Named::source(&w.spec.name),
                        section: w.watch.section(),
                        body: SourceVersion { spec: w.spec.clone(), nets },
                    };
                    if self.sink.try_send(Decision::Source(Box::new(version))).is_err() {
                        w.watch.force();
                    }
                }
                Err(e) => {
                    w.state.read_errors += 1;
                    let (name, path) = (&w.spec.name, w.spec.path.display());
                    tracing::warn!(event = "source", ok = false, source = %name, "limiter: source {name}: {path}: {e}; its last version stays");
                }
            }
        }
    }
}

impl Feature for Sources {
    /// Exactly the policy's `[[source]]` sections: an unchanged one keeps
    /// its state, a new or changed one is read at the next tick.
    fn apply(&mut self, a: &InForce<'_>) {
        self.files.follow(&a.policy.sources, |spec| Report {
            name: spec.name.clone(),
            kind: spec.kind.clone(),
            ..Report::default()
        });
        for spec in &a.policy.sources {
            let networks = a.state.source_sets().find(|(n, _)| **n == spec.name).map_or(0, |(_, s)| s.nets.len());
            if let Some(w) = self.files.get_mut(&spec.name) {
                w.state.networks = networks;
            }
        }
    }

    /// SIGHUP: every source is read again.
    fn reload(&mut self, _: &InForce<'_>) {
        self.files.force_all();
    }

    /// Send what was read, then look at each source's file whose turn it
    /// is, off the loop.
    fn tick(&mut self, _: &Second<'_>) {
        self.reads_done();
        self.files.look(read);
    }

    /// The policy state refused a version of a source.
    fn applied(&mut self, a: &mut Applied<'_>) {
        let Some(Named { by: Origin::Source, name }) = a.origin() else { return };
        if !a.ok
            && let Some(w) = self.files.get_mut(&name)
        {
            w.state.refused += 1;
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(Reports(self.files.iter().map(|w| w.state.clone()).collect())))
    }
}

/// A version of a source, read whole: the policy state checks it and
/// applies the policy with it.
#[derive(Debug)]
struct SourceVersion {
    spec: Source,
    nets: BTreeSet<IpNet>,
}

impl VersionOf for SourceVersion {
    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        state.source_version(tables, &self.spec, std::mem::take(&mut self.nets))
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        let name = &self.spec.name;
        match result {
            Ok(line) => tracing::info!(event = "source", ok = true, source = %name, "limiter: {line}"),
            Err(e) => {
                tracing::warn!(event = "source", ok = false, source = %name, "limiter: source {name}: {e}; its last version stays");
            }
        }
    }
}

/// Each source's reads, as series.
#[derive(Debug)]
struct Reports(Vec<Report>);

impl Series for Reports {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            "limiter_source_versions",
            "Versions of each [[source]] file by result: applied, read_error (the file or a line of it; the last version stays), refused (too wide, too many, shrank too much, or the policy with it could not be applied).",
            None,
            MetricType::Counter,
        )?;
        for r in &self.0 {
            let applied = r.reads.saturating_sub(r.refused);
            for (result, n) in [("applied", applied), ("read_error", r.read_errors), ("refused", r.refused)] {
                let labels = [("source", r.name.as_str()), ("kind", r.kind.as_str()), ("result", result)];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_source_networks",
            "Networks of each [[source]]'s version in force.",
            None,
            MetricType::Gauge,
        )?;
        for r in &self.0 {
            let labels = [("source", r.name.as_str()), ("kind", r.kind.as_str())];
            ConstGauge::new(clamp(r.networks as u64)).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
