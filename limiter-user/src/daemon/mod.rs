//! The running daemon: [`Daemon::start`] loads, applies the policy and
//! attaches; [`Daemon::run`] serves the control socket and `/metrics`,
//! re-reads the policy on SIGHUP and prints status lines until its
//! shutdown future resolves.

mod answers;
mod changes;
mod cookie_watch;
mod crowdsec;
mod enforcer;
mod feature;
mod features;
mod feedback;
mod feeds;
mod fleet;
mod forward;
mod observe;
mod os;
mod show;
mod source;
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
    features::{Features, Start},
    observe::{Observer, status_line},
    os::{notify_ready, raise_memlock},
    source::SourceChange,
    view::View,
};
pub use self::{
    enforcer::{ApplyError, Enforcer},
    os::init_logging,
};
use crate::{
    control::{
        ReloadInfo,
        server::{self, Bound, Call},
    },
    dataplane::{
        AttachMode, Attachment, DataPlane, Health,
        maps::Tables,
        upgrade::{Renewal, renewal_loss},
    },
    metrics::ScrapeCall,
    policy::{self, Loaded, Overlay, PolicyError},
};

/// How the daemon is to run (from `limiter run`'s arguments).
#[derive(Clone, Debug)]
pub struct Settings {
    pub iface: String,
    pub mode: AttachMode,
    /// Exclusive, or a libxdp dispatcher's component (`--attach`).
    pub attach: crate::dataplane::chain::Attach,
    /// Run priority under a libxdp dispatcher (`--priority`).
    pub priority: u32,
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

/// Policy applies since start, for `status` and the metrics.
#[derive(Debug)]
struct Reloads {
    started: Instant,
    last: Option<ReloadInfo>,
    applied: u64,
    rejected: u64,
    /// Unix times of the last applied and the last rejected policy.
    last_applied: Option<u64>,
    last_rejected: Option<u64>,
}

/// The program's link to its interface, as last checked.
struct Link {
    attachment: Attachment,
    health: Health,
    /// Times the daemon put back a lost link or pin.
    repairs: u64,
}

/// What wakes the loop besides its timers.
struct Inputs {
    hup: Signal,
    calls: mpsc::Receiver<Call>,
    scrapes: mpsc::Receiver<ScrapeCall>,
    /// What the sources of decisions (feeds, CrowdSec) send.
    decided: mpsc::Receiver<Box<dyn SourceChange>>,
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
    link: Link,
    features: Features,
    /// The control socket (removed on drop if still ours).
    socket: Bound,
    reloads: Reloads,
    observer: Observer,
    inputs: Inputs,
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
        // Checked before anything is touched: a bad policy or token, an
        // unknown group or interface changes nothing (invariant 6).
        let checked = start::Checked::of(&settings)?;
        // One daemon per socket.
        let mut socket = server::bind(&settings.socket, checked.access)?;
        raise_memlock();
        let mut first = start::load(&settings, checked, None)?;
        let (start::Loaded { mut dp, adopted, enforcer, summary, token }, (attachment, replaced)) =
            match start::attach(&mut first.dp, &settings, first.adopted.is_some()) {
                Ok(a) => (first, a),
                // A dispatcher whose slots refuse the full program's
                // component (6.12 with Debian 12's libxdp): the program
                // without SYN cookies joins, if the policy has none (else
                // the policy is refused, naming its class).
                Err(e) if start::packet_data_slot(&e) => {
                    drop(first);
                    let why = "this kernel refuses a dispatcher component that changes packet data in the slots of \
                               the libxdp dispatcher this build uses"
                        .to_owned();
                    let mut again = start::load(&settings, start::Checked::of(&settings)?, Some(why))?;
                    let a = start::attach(&mut again.dp, &settings, again.adopted.is_some())?;
                    (again, a)
                }
                Err(e) => return Err(e),
            };
        let observer = Observer::new(dp.buckets_map_id(), dp.take_drop_events(), dp.take_logger());
        let (calls_tx, calls) = mpsc::channel(16);
        let (scrape_tx, scrapes) = mpsc::channel(4);
        let tables = dp.maps.take_tables().expect("the policy tables are ours at start");
        let (view, effective) = View::of(&enforcer);
        let applied = view.applied(&enforcer, &effective);
        let windows = dp.maps.windows.take();
        let (sink, decided) = mpsc::channel(source::SINK_ROOM);
        let start = Start { windows, buckets: dp.buckets_map_id(), token, calls: &calls_tx, sink: &sink };
        let features = Features::start(&applied, start).await?;
        socket.serve(calls_tx);
        let d = Self {
            settings,
            dp,
            policy: Some((enforcer, tables)),
            view,
            changes: Changes::default(),
            link: Link { attachment, health: Health::Attached, repairs: 0 },
            features,
            socket,
            reloads: Reloads::new(),
            observer,
            inputs: Inputs { hup, calls, scrapes, decided },
        };
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
                _ = self.inputs.hup.recv() => self.change(Change::Reload, None),
                Some((req, reply)) = self.inputs.calls.recv() => self.handle(req, reply),
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
                    self.features.tick();
                }
                // Every source of decisions, one arm: its change waits
                // behind the operator's (each source bounds what it sends).
                Some(change) = self.inputs.decided.recv() => self.decided(change),
                Some(reply) = self.inputs.scrapes.recv() => {
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
        self.features.drain().await;
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
        let attachment = self.link.attachment;
        match attachment.pin_dir() {
            Some(dir) if attachment.is_pinned() => tracing::info!(
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
        drop(attachment);
        Ok(())
    }

    /// Record the outcome of a reload for `status` and the metrics.
    fn note_reload(&mut self, ok: bool, message: String) {
        let now = crate::clock::unix_now();
        let r = &mut self.reloads;
        if ok {
            (r.applied, r.last_applied) = (r.applied + 1, Some(now));
        } else {
            (r.rejected, r.last_rejected) = (r.rejected + 1, Some(now));
        }
        r.last = Some(ReloadInfo { ok, message, unix_time: now });
    }
}

impl Reloads {
    fn new() -> Self {
        Self { started: Instant::now(), last: None, applied: 0, rejected: 0, last_applied: None, last_rejected: None }
    }
}
