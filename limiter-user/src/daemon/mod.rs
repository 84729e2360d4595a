//! The running daemon: [`Daemon::start`] loads, applies the policy and
//! attaches; [`Daemon::run`] serves the control socket and `/metrics`,
//! re-reads the policy on SIGHUP and prints status lines until its
//! shutdown future resolves.

mod answers;
mod capture;
mod explain;
mod features;
mod link;
mod observe;
mod os;
mod reloads;
mod show;
mod start;
mod view;

use std::time::{Duration, Instant};

use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

pub use self::os::init_logging;
use self::{
    answers::Answers,
    features::{Features, Start},
    link::Link,
    observe::{Observer, status_line},
    os::{notify_ready, raise_memlock},
    reloads::Reloads,
    view::View,
};
pub use crate::engine::{ApplyError, Enforcer, Settings};
use crate::{
    control::{
        Request, Response,
        server::{self, Bound, Call, Reply},
    },
    dataplane::{
        DataPlane, LoadError,
        chain::ChainError,
        upgrade::{Renewal, renewal_loss},
    },
    engine::{
        changes::{Change, Changes, Done, Finished, Queued},
        decision::Decision,
        feature::{Applied, Second},
    },
    metrics::ScrapeCall,
};

/// What wakes the loop besides its timers.
struct Inputs {
    /// The control socket's queries (its change requests are decisions).
    queries: mpsc::Receiver<Call>,
    scrapes: mpsc::Receiver<ScrapeCall>,
    /// Every decider's decisions (see `decision.rs`).
    decided: mpsc::Receiver<Decision>,
}

/// A running daemon: its parts, each with its own state and methods; the
/// loop hands each input to the part it is for.
pub struct Daemon {
    settings: Settings,
    dp: DataPlane,
    /// The policy state and its changes (see `changes`).
    changes: Changes,
    view: View,
    link: Link,
    features: Features,
    /// The control socket (removed on drop if still ours).
    socket: Bound,
    reloads: Reloads,
    observer: Observer,
    /// Frames the program copies, for `limiter capture` and the attacks.
    capture: capture::Capturing,
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
                Err(LoadError::Chain(ChainError::PacketDataSlot { .. })) => {
                    drop(first);
                    let why = "this kernel refuses a dispatcher component that changes packet data in the slots of \
                               the libxdp dispatcher this build uses"
                        .to_owned();
                    let mut again = start::load(&settings, start::Checked::of(&settings)?, Some(why))?;
                    let a = start::attach(&mut again.dp, &settings, again.adopted.is_some())?;
                    (again, a)
                }
                Err(e) => return Err(e.into()),
            };
        let observer = Observer::new(dp.buckets_map_id(), dp.take_drop_events(), dp.take_logger());
        let capture = capture::Capturing::new(dp.take_capture());
        let (calls_tx, calls) = mpsc::channel(16);
        let (queries_tx, queries) = mpsc::channel(16);
        let (scrape_tx, scrapes) = mpsc::channel(4);
        let tables = dp.maps.take_tables().expect("the policy tables are ours at start");
        let (view, effective) = View::of(&enforcer);
        let applied = view.applied(&enforcer, &effective);
        let windows = dp.maps.windows.take();
        let tunnel = dp.maps.tunnel.take();
        let (sink, decided) = mpsc::channel(crate::engine::decision::SINK_ROOM);
        tokio::spawn(crate::engine::decision::route(calls, sink.clone(), queries_tx));
        tokio::spawn(crate::engine::decision::hangups(hup, sink.clone()));
        let start = Start {
            windows,
            tunnel,
            buckets: dp.buckets_map_id(),
            token,
            calls: &calls_tx,
            sink: &sink,
            iface: &settings.iface,
            history: settings.history.clone(),
            attacks: settings.attacks.clone(),
        };
        let features = Features::start(&applied, start).await?;
        socket.serve(calls_tx);
        let d = Self {
            settings,
            dp,
            changes: Changes::new(enforcer, tables),
            view,
            link: Link::new(attachment),
            features,
            socket,
            reloads: Reloads::new(),
            observer,
            capture,
            inputs: Inputs { queries, scrapes, decided },
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
                Some((req, reply)) = self.inputs.queries.recv() => self.handle(req, reply),
                done = self.changes.done(), if self.changes.running() => {
                    match done {
                        Ok(done) => self.finished(done),
                        Err(_) => anyhow::bail!("a policy change thread died; the data plane keeps its last policy"),
                    }
                }
                _ = drain.tick() => self.drain(),
                _ = second.tick() => {
                    let totals = self.dp.maps.totals()?;
                    if let Some(delta) = self.observer.tick_second(&totals) {
                        self.capture.second(&delta);
                    }
                    if !self.view.groups.is_empty() {
                        self.observer.tick_groups(self.dp.maps.counters.group_hits(self.view.groups.len())?);
                    }
                    self.link.check(&mut self.dp, &self.settings.iface);
                    self.changes.expire(&self.settings);
                    let syn_cookies = self.answers().syn_cookie_states().unwrap_or_default();
                    let tcp_state = self.answers().tcp_states().unwrap_or_default();
                    self.features.tick(&Second {
                        totals: &totals,
                        top: &self.observer.top,
                        syn_cookies: &syn_cookies,
                        tcp_state: &tcp_state,
                    });
                }
                // Every decider, one arm (see `decision.rs`): a source's
                // change waits behind the operator's.
                Some(decision) = self.inputs.decided.recv() => self.decide(decision),
                Some(reply) = self.inputs.scrapes.recv() => {
                    if let Ok(s) = self.answers().snapshot() {
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
        // A program left enforcing copies nothing for no one.
        self.capture.off();
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
            if self.changes.policy().is_some_and(|p| capacity != p.base().capacity) {
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

    /// A query: answered now, by a feature or from the loop's parts, or
    /// queued while it needs the policy state a change has away.
    fn handle(&mut self, req: Request, reply: Reply) {
        if let Some(answer) = self.capture.answer(&req, &self.view.class_names) {
            let _ = reply.send(answer);
            return;
        }
        if let Some(answer) = self.features.answer(&req, &reply.by) {
            let _ = reply.send(answer);
            return;
        }
        if matches!(req, Request::Top { .. }) {
            self.drain();
        }
        match self.answers().answer(req) {
            Ok(response) => drop(reply.send(response)),
            Err(req) => self.changes.enqueue(Queued::Call(req, reply)),
        }
    }

    /// The networks features asked to have described, told what every
    /// feature says of each (as `limiter prefix show`).
    fn describe(&mut self) {
        for (i, net) in self.features.wants_described() {
            let shown = show::prefix_show(self.changes.policy(), &self.view, &self.features, net);
            if let Ok(shown) = shown {
                self.features.described(i, net, &shown);
            }
        }
    }

    /// The program's sampled drops since the last drain: counted for
    /// `limiter top`, and handed to every feature.
    fn drain(&mut self) {
        let features = &mut self.features;
        self.observer.drain_drop_events(|s| features.sampled(s));
        self.capture.drain(features, &self.view.class_names);
        self.describe();
    }

    /// The loop's parts, borrowed for a read-only answer.
    fn answers(&self) -> Answers<'_> {
        Answers {
            settings: &self.settings,
            dp: &self.dp,
            policy: self.changes.policy(),
            view: &self.view,
            link: &self.link,
            features: &self.features,
            reloads: &self.reloads,
            observer: &self.observer,
            capture: self.capture.described(),
        }
    }

    /// A decision, whoever made it: the operator's and the daemon's own
    /// start off the loop (or queue behind the change running); a
    /// source's waits behind them.
    fn decide(&mut self, decision: Decision) {
        match decision {
            Decision::Asked(change, reply) => match self.features.admits(&change) {
                Ok(()) => self.changes.start(change, Some(reply), &self.settings),
                Err((code, why)) => drop(reply.send(Response::error(code, why))),
            },
            Decision::Told(change) => self.changes.start(change, None, &self.settings),
            Decision::Source(change) => self.changes.decided(change, &self.settings),
        }
    }

    /// A change finished: show the state in force, report, and go on
    /// with what waited for it until the next change starts.
    fn finished(&mut self, done: Done) {
        let Finished { change, reply, result } = self.changes.take_back(done);
        let Some(p) = self.changes.policy() else { unreachable!("the state is home") };
        self.view.refresh(p, &mut self.features);
        let version = self.view.version;
        let ok = result.is_ok();
        let line = match &result {
            Ok(summary) => summary.clone(),
            Err(e) => e.to_string(),
        };
        let refusal = match &result {
            Err(ApplyError::Governor { refusal, .. }) => Some(*refusal),
            _ => None,
        };
        let response = match &change {
            Change::Reload => {
                self.reloads.reloaded(result, version, &self.view.source);
                self.view.reload(p, &mut self.features);
                None
            }
            Change::Expire => {
                Reloads::expired(result, version);
                None
            }
            Change::Source(c) => {
                c.report(&result);
                None
            }
            _ => Some(self.reloads.changed(&change, result, version)),
        };
        // Every feature hears of every change, whoever made it (the
        // upstream speaker announces an escalation's denial, and the
        // operator's `prefix deny --upstream` in its answer).
        let mut response = response;
        let by = reply.as_ref().map(|r| &r.by);
        self.features.applied(&mut Applied { change: &change, by, ok, line: &line, refusal, reply: response.as_mut() });
        if let (Some(reply), Some(r)) = (reply, response) {
            let _ = reply.send(r);
        }
        while let Some(q) = self.changes.next_queued() {
            match q {
                Queued::Change(c, reply) => self.changes.start(c, reply, &self.settings),
                Queued::Call(req, reply) => self.handle(req, reply),
            }
        }
        self.changes.next_part(&self.settings);
    }
}
