//! The running daemon's state and what it does with control requests.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use ipnet::IpNet;
use limiter_common::{Reason, maps};

use crate::{
    control::{ClassRow, PrefixEntry, ReasonRow, ReloadInfo, Request, Response, StatsInfo, StatusInfo},
    loader::{AttachMode, Limiter},
    policy::{Limit, Override, OverrideAction, Policy, PolicyError, file, runtime},
    run::describe,
};

/// Everything the daemon knows while it runs.
pub struct Daemon {
    pub limiter: Limiter,
    pub iface: String,
    pub mode: AttachMode,
    pub pin_dir: Option<PathBuf>,
    /// The policy from the file (or built-in) with the command-line flags.
    pub base: Policy,
    /// Where `base` came from.
    pub source: String,
    /// Overrides set at run time: `Some` adds or replaces, `None` removes
    /// a file override. Merged over `base` on every apply.
    pub runtime: BTreeMap<IpNet, Option<OverrideAction>>,
    /// Version the data plane enforces.
    pub version: u64,
    pub capacity: u32,
    pub started: Instant,
    pub last_reload: Option<ReloadInfo>,
    /// Applied and rejected policies since start, and when last.
    pub reloads: [u64; 2],
    pub reload_times: [Option<u64>; 2],
    /// Tracked prefixes, counted in the background by [`spawn_tracker`].
    pub tracked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Sampled drops and per-second totals for `limiter top`.
    pub top: crate::top::Tracker,
    pub drop_events: Option<aya::maps::RingBuf<aya::maps::MapData>>,
    /// Forwards the program's aya-log lines (debug level only).
    pub ebpf_log: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// Totals at the last per-second tick.
    pub last_tick: Option<crate::stats::Totals>,
}

/// Count the bucket map's entries on a thread of its own, with its own
/// map handle, so a walk of a million keys never blocks the daemon loop, a
/// scrape or a status line. It walks every `every`, or every 20 walk
/// durations when walks get long, so counting stays under ~5% of a core;
/// the count is that old at most.
#[must_use]
pub fn spawn_tracker(map_id: u32, every: std::time::Duration) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    let count = Arc::new(AtomicUsize::new(0));
    let out = Arc::clone(&count);
    std::thread::spawn(move || {
        let Ok(md) = aya::maps::MapData::from_id(map_id) else { return };
        let Ok(m) = aya::maps::HashMap::<_, limiter_common::BucketKey, limiter_common::BucketState>::try_from(
            aya::maps::Map::LruHashMap(md),
        ) else {
            return;
        };
        loop {
            let start = std::time::Instant::now();
            count.store(m.keys().flatten().count(), Ordering::Relaxed);
            std::thread::sleep(every.max(start.elapsed() * 20));
        }
    });
    out
}

/// Why an apply failed: the policy (nothing changed) or the kernel.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Load(#[from] crate::loader::LoadError),
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Daemon {
    /// `base` with the runtime overrides merged in.
    #[must_use]
    pub fn effective(&self, base: &Policy) -> Policy {
        let mut p = base.clone();
        p.overrides.retain(|o| !self.runtime.contains_key(&o.net));
        p.overrides.extend(self.runtime.iter().filter_map(|(net, a)| a.map(|action| Override { net: *net, action })));
        p
    }

    /// Validate `base` (with runtime overrides) as the next version and
    /// switch to it; on any error nothing changes.
    pub fn apply(&mut self, base: Policy, source: String) -> Result<String, ApplyError> {
        let next = self.version + 1;
        let p = self.effective(&base);
        let (cfg, ovr) = (p.compile(next)?, p.compile_overrides()?);
        self.limiter.apply(&cfg, &ovr)?;
        self.version = next;
        self.base = base;
        self.source = source;
        let mut summary = describe(&p, next);
        if p.capacity != self.capacity {
            let _ = write!(summary, "; capacity stays {} until a restart", self.capacity);
        }
        Ok(summary)
    }

    /// Record the outcome of a reload for `status`.
    pub fn note_reload(&mut self, ok: bool, message: String) {
        let now = unix_now();
        let i = usize::from(!ok);
        self.reloads[i] += 1;
        self.reload_times[i] = Some(now);
        self.last_reload = Some(ReloadInfo { ok, message, unix_time: now });
    }

    /// Tracked prefixes as last counted in the background.
    #[must_use]
    pub fn tracked(&self) -> usize {
        self.tracked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Each class of the running policy by name, with its counters.
    fn class_counters(&self) -> Result<Vec<(String, limiter_common::ClassCounters)>, crate::loader::LoadError> {
        let per_class = self.limiter.class_totals()?;
        Ok(self.base.class_names().iter().zip(per_class).map(|(n, c)| ((*n).to_owned(), c)).collect())
    }

    /// Numbers for one metrics scrape, read from the kernel now.
    pub fn snapshot(&self) -> Result<crate::metrics::Snapshot, crate::loader::LoadError> {
        Ok(crate::metrics::Snapshot {
            totals: self.limiter.totals()?,
            classes: self.class_counters()?,
            policy_version: self.version,
            capacity: self.capacity,
            tracked: self.tracked(),
            iface: self.iface.clone(),
            attach_mode: self.mode.label().into(),
            reloads_ok: self.reloads[0],
            reloads_failed: self.reloads[1],
            last_reload_ok: self.reload_times[0],
            last_reload_failed: self.reload_times[1],
        })
    }

    /// Answer one control request.
    pub fn handle(&mut self, req: Request, reload: impl FnOnce() -> Result<(Policy, String), PolicyError>) -> Response {
        let fail = |e: &dyn std::fmt::Display| Response::Error { message: e.to_string() };
        match req {
            Request::Status => self.status().unwrap_or_else(|e| fail(&e)),
            Request::Stats => self.stats().unwrap_or_else(|e| fail(&e)),
            Request::PolicyShow => Response::Policy {
                version: self.version,
                source: self.source.clone(),
                text: file::render(&self.effective(&self.base)),
            },
            Request::PolicyApply { name, text } => {
                let loaded = match text {
                    Some(t) => file::parse(&name, &t, &Policy::default()).map(|p| (p, name)),
                    None => reload(),
                };
                let result = loaded.map_err(ApplyError::from).and_then(|(p, src)| self.apply(p, src));
                self.finish_apply(result)
            }
            Request::PrefixList => Response::Prefixes { version: self.version, entries: self.prefixes() },
            Request::PrefixSet { cidr, rate, burst } => {
                let limit = Limit { rate, burst, cost: self.base.default.cost, mode: self.base.default.mode };
                self.change_prefix(&cidr, Some(OverrideAction::Limit(limit)))
            }
            Request::PrefixAllow { cidr } => self.change_prefix(&cidr, Some(OverrideAction::Allow)),
            Request::PrefixDeny { cidr } => self.change_prefix(&cidr, Some(OverrideAction::Deny)),
            Request::PrefixUnset { cidr } => self.change_prefix(&cidr, None),
            Request::Top { n } => self.top_info(n),
        }
    }

    /// Move sampled drop events from the ring buffer into the tracker.
    pub fn drain_drop_events(&mut self) {
        if let Some(l) = self.ebpf_log.as_mut() {
            l.flush();
        }
        let now = unix_now();
        let Some(rb) = self.drop_events.as_mut() else { return };
        while let Some(item) = rb.next() {
            if item.len() >= std::mem::size_of::<limiter_common::DropEvent>() {
                // SAFETY: the program writes whole DropEvents; read unaligned.
                let ev = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<limiter_common::DropEvent>()) };
                self.top.record(now, ev.key);
            }
        }
    }

    /// Once a second: note packets passed and dropped for the sparkline.
    pub fn tick_second(&mut self) -> Result<(), crate::loader::LoadError> {
        let t = self.limiter.totals()?;
        if let Some(last) = self.last_tick {
            let d = t.since(&last);
            self.top.tick(unix_now(), d.passed().packets, d.dropped().packets);
        }
        self.last_tick = Some(t);
        Ok(())
    }

    fn top_info(&mut self, n: usize) -> Response {
        self.drain_drop_events();
        let names = self.base.class_names();
        let offenders = self
            .top
            .offenders(unix_now(), n.min(100))
            .into_iter()
            .map(|(k, rate)| crate::control::Offender {
                prefix: crate::top::cidr(&k),
                class: names.get(usize::from(k.class)).map_or_else(|| k.class.to_string(), |s| (*s).to_owned()),
                drops_per_sec: rate,
            })
            .collect();
        let history = self.top.history();
        Response::Top(crate::control::TopInfo {
            window_secs: crate::top::WINDOW_SECS,
            sample_every: crate::top::DROP_SAMPLE,
            passed_per_sec: history.iter().map(|h| h.0).collect(),
            dropped_per_sec: history.iter().map(|h| h.1).collect(),
            offenders,
        })
    }

    fn finish_apply(&mut self, result: Result<String, ApplyError>) -> Response {
        match result {
            Ok(summary) => {
                self.note_reload(true, summary.clone());
                Response::Applied { version: self.version, summary }
            }
            Err(e) => {
                let message = format!("{e}; policy v{} keeps running", self.version);
                self.note_reload(false, message.clone());
                Response::Error { message }
            }
        }
    }

    /// Add, replace or remove one override as a new policy version.
    fn change_prefix(&mut self, cidr: &str, action: Option<OverrideAction>) -> Response {
        let net = match cidr.parse::<IpNet>() {
            Ok(n) => n,
            Err(e) => return Response::Error { message: format!("{cidr:?} is not a CIDR: {e}") },
        };
        let in_file = self.base.overrides.iter().any(|o| o.net == net);
        if action.is_none() && !self.runtime.contains_key(&net) && !in_file {
            return Response::Error { message: format!("{net} has no override") };
        }
        // Unsetting a runtime-only override forgets it; unsetting the
        // file's is an entry of its own (the file's override is removed).
        let entry = if action.is_none() && !in_file { None } else { Some(action) };
        let previous = self.runtime.get(&net).copied();
        // Recorded in the pinned RUNTIME map first, so a daemon that dies
        // right after the apply still puts it back when it restarts.
        if let Err(e) = self.record(net, entry) {
            return self.finish_apply(Err(e.into()));
        }
        let (base, source) = (self.base.clone(), self.source.clone());
        let result = self.apply(base, source);
        if result.is_err()
            && let Err(e) = self.record(net, previous)
        {
            tracing::info!("limiter: warning: runtime override of {net} not restored in {}: {e}", maps::RUNTIME);
        }
        self.finish_apply(result)
    }

    /// Set (`Some`) or forget (`None`) the runtime entry of `net`, in the
    /// pinned `RUNTIME` map and then in memory.
    #[expect(clippy::option_option, reason = "an entry of `runtime`, whose values are optional themselves")]
    fn record(&mut self, net: IpNet, entry: Option<Option<OverrideAction>>) -> Result<(), crate::loader::LoadError> {
        let value = entry.map(|a| runtime::value(a.as_ref()));
        self.limiter.set_runtime_override(&runtime::key(&net), value.as_ref())?;
        match entry {
            Some(a) => self.runtime.insert(net, a),
            None => self.runtime.remove(&net),
        };
        Ok(())
    }

    /// Put back the overrides a previous daemon set at run time (kept in
    /// the pinned `RUNTIME` map). Returns how many; entries this build
    /// cannot read are skipped with a warning.
    pub fn restore_runtime_overrides(&mut self) -> Result<usize, crate::loader::LoadError> {
        for (k, v) in self.limiter.runtime_overrides()? {
            if let Some((net, action)) = runtime::decode(&k, &v) {
                self.runtime.insert(net, action);
            } else {
                tracing::info!("limiter: warning: skipped an unreadable entry of {}: {k:?}", maps::RUNTIME);
            }
        }
        Ok(self.runtime.len())
    }

    fn prefixes(&self) -> Vec<PrefixEntry> {
        let file_nets: Vec<IpNet> = self.base.overrides.iter().map(|o| o.net).collect();
        self.effective(&self.base)
            .overrides
            .iter()
            .map(|o| {
                let (action, rate, burst) = match o.action {
                    OverrideAction::Limit(l) => ("limit", Some(l.rate), Some(l.burst)),
                    OverrideAction::Allow => ("allow", None, None),
                    OverrideAction::Deny => ("deny", None, None),
                };
                let runtime = self.runtime.contains_key(&o.net) || !file_nets.contains(&o.net);
                PrefixEntry {
                    cidr: o.net.to_string(),
                    action: action.into(),
                    rate,
                    burst,
                    origin: if runtime { "runtime" } else { "file" }.into(),
                }
            })
            .collect()
    }

    fn status(&self) -> Result<Response, crate::loader::LoadError> {
        let t = self.limiter.totals()?;
        Ok(Response::Status(StatusInfo {
            iface: self.iface.clone(),
            attach_mode: self.mode.label().into(),
            pin_dir: self.pin_dir.as_ref().map(|p| p.display().to_string()),
            policy_version: self.version,
            policy_source: self.source.clone(),
            policy: describe(&self.effective(&self.base), self.version),
            capacity: self.capacity,
            tracked: self.tracked(),
            passed_packets: t.passed().packets,
            dropped_packets: t.dropped().packets,
            uptime_secs: self.started.elapsed().as_secs(),
            last_reload: self.last_reload.clone(),
        }))
    }

    fn stats(&self) -> Result<Response, crate::loader::LoadError> {
        let t = self.limiter.totals()?;
        let reasons = Reason::ALL
            .iter()
            .map(|r| {
                let c = t.get(*r);
                ReasonRow {
                    reason: r.label().into(),
                    verdict: format!("{:?}", r.verdict()).to_lowercase(),
                    packets: c.packets,
                    bytes: c.bytes,
                }
            })
            .collect();
        let classes = self
            .class_counters()?
            .into_iter()
            .map(|(class, c)| ClassRow {
                class,
                admitted: c.admitted.packets,
                dropped: c.dropped.packets,
                shadow_dropped: c.shadow.packets,
            })
            .collect();
        Ok(Response::Stats(StatsInfo { reasons, classes }))
    }
}
