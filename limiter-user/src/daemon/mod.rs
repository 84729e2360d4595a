//! The running daemon: [`Daemon::start`] loads, applies the policy and
//! attaches; [`Daemon::run`] serves the control socket and `/metrics`,
//! re-reads the policy on SIGHUP and prints status lines until its
//! shutdown future resolves.

mod answers;
mod enforcer;
mod observe;
mod os;

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::programs::xdp::XdpLinkId;
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc,
};

pub use self::{
    enforcer::{ApplyError, Enforcer},
    os::init_logging,
};
use self::{
    observe::{Observer, status_line},
    os::{notify_ready, raise_memlock, resolve_group},
};
use crate::{
    control::{
        ReloadInfo,
        server::{self, Access, Call},
    },
    dataplane::{AttachMode, DataPlane, PolicyMaps as _},
    metrics::{self, ScrapeCall},
    policy::{self, Loaded, Overlay, PolicyError},
};

/// How the daemon is to run (from `limiter run`'s arguments).
#[derive(Clone, Debug)]
pub struct Settings {
    pub iface: String,
    pub mode: AttachMode,
    /// Pin under this directory (`--pin`).
    pub pin_dir: Option<PathBuf>,
    pub socket: PathBuf,
    /// Group (name or gid) allowed on the control socket besides root.
    pub socket_group: Option<String>,
    pub metrics: Option<SocketAddr>,
    /// Between status lines; `None` = no status lines.
    pub status_interval: Option<Duration>,
    /// `--policy`; else the default path if a file is there.
    pub policy: Option<PathBuf>,
    pub overlay: Overlay,
}

impl Settings {
    /// The policy to enforce: the file (or the built-in policy) with the
    /// command-line flags laid over it.
    pub fn load_policy(&self) -> Result<Loaded, PolicyError> {
        let mut loaded = match policy::resolve_path(self.policy.as_deref()) {
            Some(path) => policy::file::read(&path)?,
            None => Loaded::built_in(),
        };
        loaded.policy = self.overlay.apply(loaded.policy)?;
        Ok(loaded)
    }
}

/// Applied and rejected policies since start.
#[derive(Debug, Default)]
struct Reloads {
    last: Option<ReloadInfo>,
    /// [applied, rejected]: how many, and the Unix time of the last.
    count: [u64; 2],
    at: [Option<u64>; 2],
}

/// A running daemon.
pub struct Daemon {
    settings: Settings,
    dp: DataPlane,
    policy: Enforcer,
    /// The XDP link when not pinned (detached on exit).
    link: Option<XdpLinkId>,
    started: Instant,
    reloads: Reloads,
    observer: Observer,
    hup: Signal,
    calls: mpsc::Receiver<Call>,
    scrapes: mpsc::Receiver<ScrapeCall>,
}

impl Daemon {
    /// Load (or re-adopt) the data plane, apply the policy, attach, and
    /// open the control socket and `/metrics`. The program never runs
    /// without a policy: it is written before the program is attached.
    pub async fn start(settings: Settings) -> anyhow::Result<Self> {
        // First: a SIGHUP during start-up is then handled once the loop
        // runs instead of killing the process.
        let hup = signal(SignalKind::hangup())?;
        let loaded = settings.load_policy()?;
        let access = Access { gid: settings.socket_group.as_deref().map(resolve_group).transpose()? };
        raise_memlock();
        let capacity = loaded.policy.capacity;
        let (mut dp, adopted) = match &settings.pin_dir {
            Some(dir) => DataPlane::open_pinned(capacity, dir)?,
            None => (DataPlane::open(capacity)?, false),
        };
        // Versions continue from what a re-adopted data plane enforces.
        let version = dp.active_config()?.map_or(0, |c| c.version);
        let mut policy = Enforcer::new(version, dp.capacity());
        let summary = first_apply(&mut policy, &mut dp, &settings, loaded)?;
        let (link, replaced) = match &settings.pin_dir {
            Some(dir) => (None, dp.attach_pinned(&settings.iface, settings.mode, dir)?),
            None => (Some(dp.attach(&settings.iface, settings.mode)?), false),
        };
        let observer = Observer::new(dp.buckets_map_id(), dp.take_drop_events(), dp.take_logger());
        let (calls_tx, calls) = mpsc::channel(16);
        let (scrape_tx, scrapes) = mpsc::channel(4);
        let d = Self {
            settings,
            dp,
            policy,
            link,
            started: Instant::now(),
            reloads: Reloads::default(),
            observer,
            hup,
            calls,
            scrapes,
        };
        d.announce(&summary, adopted, replaced);
        server::listen(&d.settings.socket, access, calls_tx)?;
        tracing::info!("limiter: control socket {} (mode 0660)", d.settings.socket.display());
        if let Some(addr) = d.settings.metrics {
            // Metrics are an aid; a busy port must not leave the interface unprotected.
            match metrics::serve(addr, scrape_tx).await {
                Ok(bound) => tracing::info!("limiter: metrics on http://{bound}/metrics"),
                Err(e) => tracing::warn!("limiter: metrics not served on {addr}: {e}"),
            }
        }
        notify_ready();
        Ok(d)
    }

    /// Serve until `shutdown` resolves (to the name of what stopped it),
    /// then detach (or leave the pinned program enforcing) and print the
    /// totals.
    pub async fn run(mut self, shutdown: impl Future<Output = &'static str>) -> anyhow::Result<()> {
        let period = self.settings.status_interval.unwrap_or(Duration::from_hours(1));
        let mut status = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let (mut last, mut last_at) = (self.dp.totals()?, Instant::now());
        let mut drain = tokio::time::interval(Duration::from_millis(200));
        let mut second = tokio::time::interval(Duration::from_secs(1));
        tokio::pin!(shutdown);
        let why = loop {
            tokio::select! {
                why = &mut shutdown => break why,
                _ = self.hup.recv() => self.reload(),
                Some((req, reply)) = self.calls.recv() => {
                    let _ = reply.send(self.answer(req));
                }
                _ = drain.tick() => self.observer.drain_drop_events(),
                _ = second.tick() => self.observer.tick_second(&self.dp.totals()?),
                Some(reply) = self.scrapes.recv() => {
                    if let Ok(s) = self.snapshot() {
                        let _ = reply.send(s);
                    }
                }
                _ = status.tick(), if self.settings.status_interval.is_some() => {
                    let now = self.dp.totals()?;
                    let line = status_line(&now, &last, last_at.elapsed(), self.observer.tracked(), self.dp.capacity());
                    let version = self.policy.version();
                    tracing::info!(event = "status", version, "{line} policy v{version}");
                    (last, last_at) = (now, Instant::now());
                }
            }
        };
        let _ = std::fs::remove_file(&self.settings.socket);
        self.stop(why)
    }

    /// The lines printed once the program is attached.
    fn announce(&self, summary: &str, adopted: bool, replaced: bool) {
        let (s, capacity) = (&self.settings, self.dp.capacity());
        tracing::info!(
            event = "attach",
            iface = %s.iface,
            mode = %s.mode,
            version = self.policy.version(),
            capacity,
            "limiter: attached to {} ({}), {summary}, capacity {capacity}",
            s.iface,
            s.mode
        );
        if let Some(dir) = &s.pin_dir {
            tracing::info!(
                "limiter: pinned in {}; {}; {}",
                dir.display(),
                if adopted { "re-adopted pinned maps (buckets and counters kept)" } else { "new maps" },
                if replaced { "replaced the program on the pinned link atomically" } else { "new link" },
            );
            if capacity != self.policy.base().capacity {
                tracing::info!(
                    "limiter: capacity stays {capacity} (pinned map); `limiter unload` and restart to change it"
                );
            }
        }
    }

    /// Detach (or leave pinned) and print the totals.
    fn stop(mut self, why: &str) -> anyhow::Result<()> {
        let t = self.dp.totals()?;
        let (passed, dropped) = (t.passed().packets, t.dropped().packets);
        let iface = self.settings.iface.clone();
        if let Some(link) = self.link.take() {
            self.dp.detach(link)?;
            tracing::info!(
                event = "detach",
                iface = %iface,
                signal = why,
                passed,
                dropped,
                "limiter: {why}: detached from {iface}; passed {passed} dropped {dropped} packets in total"
            );
        } else if let Some(dir) = &self.settings.pin_dir {
            tracing::info!(
                "limiter: {why}: stopping; XDP stays attached to {iface} and enforcing (pinned in {}; `limiter unload` removes it); passed {passed} dropped {dropped} packets in total",
                dir.display()
            );
        }
        Ok(())
    }

    /// SIGHUP: re-read and apply the policy as the next version, all or
    /// nothing. A rejected policy is reported and the running one stays.
    fn reload(&mut self) {
        let result = self.settings.load_policy().map_err(ApplyError::from).and_then(|l| {
            let source = l.origin.name();
            self.policy.apply(&mut self.dp, l).map(|s| (s, source))
        });
        let version = self.policy.version();
        match result {
            Ok((summary, source)) => {
                tracing::info!(event = "reload", ok = true, version, source = %source, "limiter: SIGHUP: applied {source}: {summary}");
                self.note_reload(true, summary);
            }
            Err(e) => {
                let message = format!("rejected: {e}; policy v{version} keeps running");
                tracing::warn!(event = "reload", ok = false, version, "limiter: SIGHUP: {message}");
                self.note_reload(false, message);
            }
        }
    }

    /// Record the outcome of a reload for `status` and the metrics.
    fn note_reload(&mut self, ok: bool, message: String) {
        let now = observe::unix_now();
        let i = usize::from(!ok);
        self.reloads.count[i] += 1;
        self.reloads.at[i] = Some(now);
        self.reloads.last = Some(ReloadInfo { ok, message, unix_time: now });
    }
}

/// Apply the first policy: the file's (or the built-in one), with the
/// overrides a previous daemon set at run time put back over it (they are
/// part of the policy the pinned data plane enforces).
fn first_apply(policy: &mut Enforcer, dp: &mut DataPlane, s: &Settings, loaded: Loaded) -> anyhow::Result<String> {
    let restored = policy.restore(dp)?;
    if restored > 0
        && let Some(dir) = &s.pin_dir
    {
        tracing::info!(
            "limiter: {restored} runtime override(s) put back from {} (`limiter prefix list` shows them)",
            dir.join(limiter_common::maps::RUNTIME).display()
        );
    }
    match policy.apply(dp, loaded) {
        Ok(s) => Ok(s),
        Err(e) if restored > 0 => anyhow::bail!(
            "{e} (the policy with {restored} runtime override(s) put back from the pins; the pinned program keeps enforcing the last policy)"
        ),
        Err(e) => Err(e.into()),
    }
}
