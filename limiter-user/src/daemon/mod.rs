//! The running daemon: [`Daemon::start`] loads, applies the policy and
//! attaches; [`Daemon::run`] serves the control socket and `/metrics`,
//! re-reads the policy on SIGHUP and prints status lines until its
//! shutdown future resolves.

mod answers;
mod changes;
mod cookie_watch;
mod enforcer;
mod feature;
mod fleet;
mod observe;
mod os;
mod start;
mod view;
mod watch;

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc,
};

use self::{
    changes::{Change, Changes},
    feature::Feature as _,
    observe::{Observer, status_line},
    os::{notify_ready, raise_memlock, resolve_group},
    view::View,
};
pub use self::{
    enforcer::{ApplyError, Enforcer},
    os::init_logging,
};
use crate::{
    control::{
        ReloadInfo,
        server::{self, Access, Bound, Call},
    },
    dataplane::{
        AttachMode, Attachment, DataPlane, Health, PolicyMaps as _,
        maps::Tables,
        upgrade::{Renewal, renewal_loss},
    },
    forward,
    metrics::ScrapeCall,
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

/// Whether the program is on its interface, as last checked.
#[derive(Debug)]
struct Watch {
    health: Health,
    /// Times the daemon put back a lost link or pin.
    repairs: u64,
}

/// A running daemon.
pub struct Daemon {
    settings: Settings,
    dp: DataPlane,
    /// The policy state and the tables it writes; `None` while a change
    /// runs off the loop (see `changes`).
    policy: Option<(Enforcer, Tables)>,
    view: View,
    changes: Changes,
    attachment: Attachment,
    watch: Watch,
    /// The forwarders to the tenant layer.
    forwards: forward::Manager,
    /// The fleet sync of window quotas (or the maps it would use).
    fleet: fleet::FleetSide,
    /// The control socket (removed on drop if still ours).
    socket: Bound,
    started: Instant,
    reloads: Reloads,
    observer: Observer,
    hup: Signal,
    calls: mpsc::Receiver<Call>,
    scrapes: mpsc::Receiver<ScrapeCall>,
    /// The feedback endpoint in force.
    feedback: Option<crate::feedback::Endpoint>,
}

impl Daemon {
    /// Load (or re-adopt) the data plane, apply the policy, attach, and
    /// open the control socket and `/metrics`. The program never runs
    /// without a policy: it is written before the program is attached.
    pub async fn start(settings: Settings) -> anyhow::Result<Self> {
        // First: a SIGHUP during start-up is then handled once the loop
        // runs instead of killing the process.
        let hup = signal(SignalKind::hangup())?;
        crate::listen::raise_nofile();
        let loaded = settings.load_policy()?;
        // Validated before anything is touched: a bad policy changes
        // nothing (invariant 6). The first apply reuses this compilation
        // unless runtime overrides are put back over it.
        let checked = loaded.check()?;
        // The feedback token is read and checked before anything is
        // attached: a bad one changes nothing.
        let token = start::feedback_token(&loaded.policy)?;
        let access = Access { gid: settings.socket_group.as_deref().map(resolve_group).transpose()? };
        // Before touching the kernel: an interface that exists (no pins
        // left behind for a typo), and one daemon per socket.
        crate::dataplane::ifindex(&settings.iface)?;
        let mut socket = server::bind(&settings.socket, access)?;
        raise_memlock();
        let capacity = loaded.policy.capacity;
        let (mut dp, adopted) = match &settings.pin_dir {
            Some(dir) => DataPlane::open_pinned(capacity, dir)?,
            None => (DataPlane::open(capacity)?, None),
        };
        // Versions continue from what a re-adopted data plane enforces
        // (or a renewed CONFIG held).
        let version = dp.active_config()?.map_or(0, |c| c.version).max(dp.carried_version());
        let mut policy = Enforcer::new(version, dp.capacity());
        let summary = start::first_apply(&mut policy, &mut dp, &settings, loaded, checked)?;
        let (attachment, replaced) = match &settings.pin_dir {
            Some(dir) => match dp.attach_pinned(&settings.iface, settings.mode, dir) {
                Ok(a) => a,
                Err(e) => {
                    if adopted.is_none() {
                        start::unpin_failed_start(dp, dir);
                    }
                    return Err(e.into());
                }
            },
            None => (dp.attach(&settings.iface, settings.mode)?, false),
        };
        let observer = Observer::new(dp.buckets_map_id(), dp.take_drop_events(), dp.take_logger());
        let (calls_tx, calls) = mpsc::channel(16);
        let (scrape_tx, scrapes) = mpsc::channel(4);
        let serving = start::serve_feedback(policy.base(), token, &calls_tx).await?;
        socket.serve(calls_tx);
        let tables = dp.maps.take_tables().expect("the policy tables are ours at start");
        let forwards = forward::Manager::new(dp.buckets_map_id());
        let mut d = Self {
            settings,
            dp,
            policy: Some((policy, tables)),
            view: View::default(),
            changes: Changes::default(),
            attachment,
            watch: Watch { health: Health::Attached, repairs: 0 },
            forwards,
            fleet: fleet::FleetSide::Off(None),
            socket,
            started: Instant::now(),
            reloads: Reloads::default(),
            observer,
            hup,
            calls,
            scrapes,
            feedback: serving,
        };
        d.refresh_view();
        let fleet_cfg = d.policy.as_ref().and_then(|(p, _)| p.base().fleet.clone());
        let classes = d.fleet_classes().unwrap_or_default();
        d.fleet = fleet::FleetSide::start(fleet_cfg.as_ref(), d.dp.maps.windows.take(), classes)?;
        d.announce(&summary, adopted.as_deref(), replaced);
        tracing::info!("limiter: control socket {} (mode 0660)", d.socket.path().display());
        start::serve_metrics(d.settings.metrics, scrape_tx).await;
        notify_ready();
        Ok(d)
    }

    /// Serve until `shutdown` resolves (to the name of what stopped it),
    /// then detach (or leave the pinned program enforcing) and print the
    /// totals.
    pub async fn run(mut self, shutdown: impl Future<Output = &'static str>) -> anyhow::Result<()> {
        let period = self.settings.status_interval.unwrap_or(Duration::from_hours(1));
        let mut status = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let (mut last, mut last_at) = (self.dp.maps.totals()?, Instant::now());
        let mut drain = tokio::time::interval(Duration::from_millis(200));
        let mut second = tokio::time::interval(Duration::from_secs(1));
        tokio::pin!(shutdown);
        let why = loop {
            tokio::select! {
                why = &mut shutdown => break why,
                _ = self.hup.recv() => self.change(Change::Reload, None),
                Some((req, reply)) = self.calls.recv() => self.handle(req, reply),
                done = async { self.changes.running.as_mut().expect("guarded").await }, if self.changes.running.is_some() => {
                    self.changes.running = None;
                    match done {
                        Ok(done) => self.finished(done),
                        Err(_) => anyhow::bail!("a policy change thread died; the data plane keeps its last policy"),
                    }
                }
                _ = drain.tick() => self.observer.drain_drop_events(),
                _ = second.tick() => {
                    let cookies = !self.view.syn_cookies.is_empty();
                    self.observer.tick_second(&self.dp.maps.totals()?, cookies);
                    self.observer.cookies.arm(&self.view.syn_cookie_ports);
                    self.check_attachment();
                    self.expire_overrides();
                    self.escalate();
                    self.fleet.tick();
                }
                Some(reply) = self.scrapes.recv() => {
                    if let Ok(s) = self.snapshot() {
                        let _ = reply.send(s);
                    }
                }
                _ = status.tick(), if self.settings.status_interval.is_some() => {
                    let now = self.dp.maps.totals()?;
                    let line = status_line(&now, &last, last_at.elapsed(), self.observer.tracked(), self.dp.capacity());
                    let version = self.view.version;
                    tracing::info!(event = "status", version, "{line} policy v{version}");
                    (last, last_at) = (now, Instant::now());
                }
            }
        };
        self.forwards.drain().await;
        self.stop(why)
    }

    /// The lines printed once the program is attached.
    fn announce(&self, summary: &str, adopted: Option<&[Renewal]>, replaced: bool) {
        let (s, capacity) = (&self.settings, self.dp.capacity());
        tracing::info!(
            event = "attach",
            iface = %s.iface,
            mode = %s.mode,
            version = self.view.version,
            capacity,
            "limiter: attached to {} ({}), {summary}, capacity {capacity}",
            s.iface,
            s.mode
        );
        if let Some(dir) = &s.pin_dir {
            for r in adopted.unwrap_or_default() {
                tracing::warn!(
                    event = "renewed",
                    map = r.name,
                    "limiter: pinned {} renewed ({}); {}",
                    r.name,
                    r.why,
                    renewal_loss(r)
                );
            }
            tracing::info!(
                "limiter: pinned in {}; {}; {}",
                dir.display(),
                match adopted {
                    None => "new maps",
                    Some([]) => "re-adopted pinned maps (buckets and counters kept)",
                    Some(_) => "re-adopted pinned maps but those renewed above (pins of another build)",
                },
                if replaced { "replaced the program on the pinned link atomically" } else { "new link" },
            );
            if self.policy.as_ref().is_some_and(|(p, _)| capacity != p.base().capacity) {
                tracing::info!(
                    "limiter: capacity stays {capacity} (pinned map); `limiter unload` and restart to change it"
                );
            }
        }
    }

    /// Detach (or leave pinned) and print the totals. The socket goes when
    /// `self` does.
    fn stop(self, why: &str) -> anyhow::Result<()> {
        let t = self.dp.maps.totals()?;
        let (passed, dropped) = (t.passed().packets, t.dropped().packets);
        let iface = &self.settings.iface;
        match self.attachment.pin_dir() {
            Some(dir) if self.attachment.is_pinned() => tracing::info!(
                "limiter: {why}: stopping; XDP stays attached to {iface} and enforcing (pinned in {}; `limiter unload` removes it); passed {passed} dropped {dropped} packets in total",
                dir.display()
            ),
            _ => tracing::info!(
                event = "detach",
                iface = %iface,
                signal = why,
                passed,
                dropped,
                "limiter: {why}: detached from {iface}; passed {passed} dropped {dropped} packets in total"
            ),
        }
        // Dropping an unpinned attachment detaches it.
        drop(self.attachment);
        Ok(())
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
