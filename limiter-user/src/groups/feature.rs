//! The groups' watcher: each `[[group]]`'s file is watched
//! (`crate::watch`: looked at off the daemon's loop, read again when it
//! changed or its `refresh` is due; a file several groups name is read
//! once per version), and the group's networks, selected and left
//! no finer than a bucket prefix, are sent to the policy state as a
//! change ([`GroupVersion`]). A file that does not read whole, or whose
//! version the guards refuse (`crate::groups::guard`), is logged with
//! why, and the version in force stays; that file is not read again
//! until it changes or its `refresh` is due.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use ipnet::IpNet;
use tokio::sync::mpsc;

use super::{GroupReport, GroupReports, Table, guard::Coverage, section::Group};
use crate::engine::{
    ApplyError, Enforcer,
    decision::{Decision, Sink},
    feature::{Applied, Feature, InForce, Second},
    source::{Version, VersionOf},
};
use crate::{
    control::{GroupShow, PrefixShow},
    dataplane::maps::Tables,
    origin::{Named, Origin},
    policy::Action,
    series::Series,
    watch::{Looked, Stamp, Watch},
};

/// A group's networks as read: the file's table, the networks, how
/// many were left out (finer than a bucket prefix), and what they cover.
type Selected = (Arc<Table>, HashSet<IpNet>, usize, Coverage);

/// Why a read gave no version: the file or its format, or the guards
/// refused what it holds (`refused`).
struct Failed {
    why: String,
    refused: bool,
}

/// What one read of a group's file gave.
struct GroupRead {
    index: usize,
    spec: Group,
    bucket: (u32, u32),
    looked: Looked<Result<Selected, Failed>>,
}

#[derive(Debug)]
struct Watched {
    spec: Group,
    /// Bucket prefixes it was selected under.
    bucket: (u32, u32),
    watch: Watch,
    report: GroupReport,
    /// What the version in force covers (the guards compare the next with
    /// it), and what the version sent to the tries covers.
    coverage: Option<Coverage>,
    sent_coverage: Option<Coverage>,
}

/// Every group of the policy in force, by index.
pub(crate) struct Groups {
    watched: Vec<Watched>,
    /// The last table read of each file, with its stamp: other groups of
    /// the same file select from it, and `prefix show` asks it.
    tables: HashMap<PathBuf, (Stamp, Arc<Table>)>,
    tx: mpsc::Sender<GroupRead>,
    rx: mpsc::Receiver<GroupRead>,
    sink: Sink,
}

impl Groups {
    pub(crate) fn new(sink: Sink) -> Self {
        let (tx, rx) = mpsc::channel(super::section::MAX_GROUPS);
        Self { watched: Vec::new(), tables: HashMap::new(), tx, rx, sink }
    }

    fn read_done(&mut self, r: GroupRead) {
        let Some(w) = self.watched.get_mut(r.index) else { return };
        if !w.watch.back(&r.looked) || w.spec != r.spec || w.bucket != r.bucket {
            w.watch.force();
            return;
        }
        let stamp = r.looked.stamp;
        match r.looked.result {
            None => {}
            Some(Ok((table, nets, left_out, coverage))) => {
                w.sent_coverage = Some(coverage);
                if let Some(stamp) = stamp {
                    self.tables.insert(w.spec.path.clone(), (stamp, table));
                }
                w.watch.read(stamp);
                w.report.reads += 1;
                w.report.modified = stamp.map(|s| s.0);
                w.report.left_out = left_out as u64;
                w.report.read_networks = nets.len() as u64;
                let version = Version {
                    origin: Named::group(&w.spec.name),
                    section: w.watch.section(),
                    body: GroupVersion { index: r.index, spec: w.spec.clone(), nets },
                };
                if self.sink.try_send(Decision::Source(Box::new(version))).is_err() {
                    w.watch.force();
                }
            }
            Some(Err(Failed { why, refused })) => {
                // Not read again until it changes or its refresh is due.
                w.watch.read(stamp);
                if refused {
                    w.report.reads += 1;
                    w.report.refused += 1;
                } else {
                    w.report.read_errors += 1;
                }
                tracing::warn!(event = "group", ok = false, group = %w.spec.name, "limiter: group {}: {why}; its last version stays", w.spec.name);
            }
        }
    }
}

impl Feature for Groups {
    /// Exactly the policy's `[[group]]` sections, by index: an unchanged
    /// one keeps its state, a new or changed one is read at the next tick.
    fn apply(&mut self, a: &InForce<'_>) {
        let bucket = (a.policy.v4_prefix, a.policy.v6_prefix);
        let mut old = std::mem::take(&mut self.watched);
        for spec in &a.policy.groups {
            let i = self.watched.len();
            match old.get(i) {
                Some(w) if w.spec == *spec && w.bucket == bucket => {
                    let w = std::mem::replace(&mut old[i], placeholder(spec, bucket));
                    self.watched.push(w);
                }
                _ => self.watched.push(placeholder(spec, bucket)),
            }
        }
        let named: HashSet<&PathBuf> = self.watched.iter().map(|w| &w.spec.path).collect();
        self.tables.retain(|p, _| named.contains(p));
    }

    fn reload(&mut self, _: &InForce<'_>) {
        for w in &mut self.watched {
            w.watch.force();
        }
    }

    fn tick(&mut self, _: &Second<'_>) {
        while let Ok(read) = self.rx.try_recv() {
            self.read_done(read);
        }
        let now = Instant::now();
        // A file another group is reading now is left to it: this group
        // selects from the table it leaves (one read per version).
        let mut reading: HashSet<PathBuf> =
            self.watched.iter().filter(|w| w.watch.busy()).map(|w| w.spec.path.clone()).collect();
        for (index, w) in self.watched.iter_mut().enumerate() {
            if reading.contains(&w.spec.path) {
                continue;
            }
            let Some(turn) = w.watch.turn(now, w.spec.refresh) else { continue };
            reading.insert(w.spec.path.clone());
            let (spec, bucket, tx, last) = (w.spec.clone(), w.bucket, self.tx.clone(), w.coverage);
            let cached = self.tables.get(&spec.path).cloned();
            let for_read = spec.clone();
            let read = move |stamp: Option<Stamp>| {
                read(&for_read, bucket, cached.filter(|(s, _)| Some(*s) == stamp).map(|(_, t)| t), last)
            };
            let send = move |looked| tx.blocking_send(GroupRead { index, spec, bucket, looked }).is_ok();
            turn.spawn(w.spec.path.clone(), read, send);
        }
    }

    fn applied(&mut self, a: &mut Applied<'_>) {
        let Some(Named { by: Origin::Group, name }) = a.origin() else { return };
        let ok = a.ok;
        if let Some(w) = self.watched.iter_mut().find(|w| w.spec.name == name) {
            if ok {
                w.report.applied_at = crate::clock::unix_now();
                w.report.networks = w.report.read_networks;
                w.coverage = w.sent_coverage.take().or(w.coverage);
            } else {
                w.report.refused += 1;
            }
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(GroupReports(self.watched.iter().map(|w| w.report.clone()).collect())))
    }

    /// The address's country and ASN (each file the groups read says what
    /// it knows), its group, and which budget holds it.
    fn show(&self, src: &limiter_common::packet::Source, a: &InForce<'_>, out: &mut PrefixShow) {
        if self.watched.is_empty() {
            return;
        }
        let addr = src.ip();
        let mut show = GroupShow::default();
        for (_, t) in self.tables.values() {
            if let Some(tag) = t.tag_of(addr) {
                show.country = show.country.or(tag.country.map(|c| String::from_utf8_lossy(&c).into_owned()));
                show.asn = show.asn.or(tag.asn);
            }
        }
        let net = out.cidr;
        let decided = a.state.groups.decided(&net);
        if let Some((network, g)) = decided.and_then(|(n, i)| Some((n, a.policy.groups.get(i as usize)?))) {
            show.group = Some(g.name.clone());
            show.network = Some(network);
            show.budget = match (g.action, g.rate) {
                (Action::Rate, Some(r)) => {
                    format!(
                        "its prefix's bucket, then group {}'s {r}/s{}",
                        g.name,
                        if g.shadow { " (shadow)" } else { "" }
                    )
                }
                (Action::Allow, _) => format!("none: group {} is allowed{}", g.name, shadow(g)),
                (Action::Deny, _) => format!("none: group {} is denied{}", g.name, shadow(g)),
                _ => String::new(),
            };
        } else {
            show.budget = "its prefix's bucket (no group holds the whole prefix)".into();
        }
        out.group = Some(show);
    }
}

fn shadow(g: &Group) -> &'static str {
    if g.shadow { " (shadow: counted, charged as any)" } else { "" }
}

fn placeholder(spec: &Group, bucket: (u32, u32)) -> Watched {
    Watched {
        spec: spec.clone(),
        bucket,
        watch: Watch::new(),
        report: GroupReport { name: spec.name.clone(), shadow: spec.shadow, ..GroupReport::default() },
        coverage: None,
        sent_coverage: None,
    }
}

/// Read (or take `cached`) the group's file, select its networks, leave
/// out those finer than a bucket prefix, and check them against the
/// guards and the coverage of the version in force (`last`).
fn read(
    spec: &Group,
    bucket: (u32, u32),
    cached: Option<Arc<Table>>,
    last: Option<Coverage>,
) -> Result<Selected, Failed> {
    let table = if let Some(t) = cached {
        t
    } else {
        let mut t = super::read(&spec.path).map_err(|e| Failed { why: e.to_string(), refused: false })?;
        t.sort();
        Arc::new(t)
    };
    let selected = table.select_with(&spec.country_codes(), &spec.asns, spec.allow_bogons);
    let (nets, left_out) = crate::nets::coarsen(selected, bucket.0, bucket.1);
    let coverage = super::guard::check(spec, &nets, last)
        .map_err(|e| Failed { why: format!("{}: {e}", spec.path.display()), refused: true })?;
    Ok((table, nets, left_out, coverage))
}

/// A version of a group's networks: the tries take the diff.
#[derive(Debug)]
struct GroupVersion {
    index: usize,
    spec: Group,
    nets: HashSet<IpNet>,
}

impl VersionOf for GroupVersion {
    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        let policy = state.base();
        if policy.groups.get(self.index) != Some(&self.spec) {
            return Err(ApplyError::Request(format!("group {}: its section changed; read again", self.spec.name)));
        }
        let bucket = (policy.v4_prefix, policy.v6_prefix);
        let index = u32::try_from(self.index).unwrap_or(u32::MAX);
        state.groups.take(tables, index, &self.spec, bucket, &self.nets)
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        let group = &self.spec.name;
        match result {
            Ok(line) => tracing::info!(event = "group", ok = true, group = %group, "limiter: {line}"),
            Err(e) => tracing::warn!(event = "group", ok = false, group = %group, "limiter: group {group}: {e}"),
        }
    }
}
