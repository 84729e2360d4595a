//! The daemon's features (the forwarders, the fleet sync, the feedback
//! endpoint, the feed watcher, CrowdSec's pulls; coexistence to come) behind one small face:
//! each starts from the policy in force, is told the policy after every
//! change, asked to read its files again on SIGHUP, ticked once a second,
//! asked at each scrape for its report (which writes its own series),
//! and drained at shutdown. A policy
//! change fans out to every feature from one place
//! ([`Daemon::refresh_view`](super::Daemon) through [`Features::apply`]),
//! so a setting of a feature goes one way, once: file -> policy ->
//! [`Applied`] -> the feature. A new feature is a field of [`Features`]
//! and a line in each of its methods.

use limiter_common::{Config, window::FleetSlot};

use super::fleet::{FleetSide, classes};
use crate::{
    dataplane::maps::WindowMaps, feedback::Endpoint, fleet::wall_and_offset, forward, policy::Policy, series::Series,
};

/// Descriptors the forwarders leave to the rest of the daemon: each
/// listener's connection cap, and room for the maps, files and clients
/// (fleet store, CrowdSec, feeds) it opens later.
const FDS_RESERVE: usize =
    crate::control::server::MAX_CONNS + crate::metrics::MAX_CONNS + crate::feedback::MAX_CONNS + 64;

/// The policy in force, as every feature sees it.
pub(super) struct Applied<'a> {
    pub(super) version: u64,
    /// The effective policy: the file's, with the runtime overrides.
    pub(super) policy: &'a Policy,
    /// What the data plane enforces of it.
    pub(super) config: Config,
    /// Class names by index (0 = `default`).
    pub(super) class_names: &'a [String],
}

/// A subsystem of the daemon.
pub(super) trait Feature {
    /// Take the policy in force: start, change or stop what it declares.
    fn apply(&mut self, applied: &Applied<'_>);

    /// SIGHUP, after the policy was read again: read again what the
    /// feature reads from files of its own.
    fn reload(&mut self, _applied: &Applied<'_>) {}

    /// Once a second, on the daemon's loop (never blocking it).
    fn tick(&mut self) {}

    /// Its report for a scrape, which writes its own series (`None`:
    /// nothing to show now).
    fn series(&self) -> Option<Box<dyn Series>>;

    /// Let what is in flight finish, each within its own bound.
    async fn drain(&mut self) {}
}

impl Feature for forward::Manager {
    /// Runs exactly the `[[forward]]` sections: unchanged ones keep
    /// running, changed and removed ones drain, new ones start.
    fn apply(&mut self, a: &Applied<'_>) {
        let ranks = std::sync::Arc::new(forward::rank::Ranks::of(a.policy));
        self.update(&a.policy.forwards, forward::Context { version: a.version, config: a.config, ranks });
    }

    /// Every forwarder's, in the policy's order.
    fn series(&self) -> Option<Box<dyn Series>> {
        Some(Box::new(forward::Reports(self.reports())))
    }

    async fn drain(&mut self) {
        self.drain_all().await;
    }
}

impl Feature for FleetSide {
    /// The window-quota classes apply at once; a changed, new or removed
    /// `[fleet]` section changes, starts or stops the sync.
    fn apply(&mut self, a: &Applied<'_>) {
        self.set_classes(classes(&a.config, a.class_names, a.policy), a.policy.fleet.as_ref());
    }

    /// Only while the sync runs.
    fn series(&self) -> Option<Box<dyn Series>> {
        self.status().map(|s| Box::new(s) as Box<dyn Series>)
    }

    /// Once a second: take the maps back from a sync that has stopped
    /// (and start the one a later policy asked for); without a sync, keep
    /// the wall-clock offset current.
    fn tick(&mut self) {
        if let Self::Stopping(s) = self
            && let Some(maps) = s.0.stopped()
        {
            let next = s.2.take();
            if maps.is_none() {
                tracing::warn!(
                    "limiter: the fleet sync's thread died; window quotas run without their maps' upkeep until the daemon restarts"
                );
            }
            *self = Self::Off(maps);
            if let Some((cfg, classes)) = next {
                self.set_classes(classes, Some(&cfg));
            }
        }
        if let Self::Off(Some(m)) = self {
            let _ = m.state.set(FleetSlot::WallOffset.index(), wall_and_offset().1, 0);
        }
    }
}

/// A feature the policy may leave out.
impl<T: Feature> Feature for Option<T> {
    fn apply(&mut self, applied: &Applied<'_>) {
        if let Some(f) = self {
            f.apply(applied);
        }
    }

    fn reload(&mut self, applied: &Applied<'_>) {
        if let Some(f) = self {
            f.reload(applied);
        }
    }

    fn tick(&mut self) {
        if let Some(f) = self {
            f.tick();
        }
    }

    async fn drain(&mut self) {
        if let Some(f) = self {
            f.drain().await;
        }
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        self.as_ref().and_then(Feature::series)
    }
}

/// The daemon's features, in the order they are told a policy.
pub(super) struct Features {
    pub(super) forward: forward::Manager,
    pub(super) fleet: FleetSide,
    pub(super) feedback: Option<Endpoint>,
    pub(super) feeds: super::feeds::Feeds,
    pub(super) crowdsec: super::crowdsec::CrowdsecSide,
}

impl Features {
    /// Start every feature the policy in force declares. `windows`: the
    /// window-quota maps (the fleet sync takes them); `buckets`: the id of
    /// the bucket map the forwarders read; `token`: the feedback
    /// endpoint's, checked before anything was attached; `calls`: where
    /// the endpoint sends its penalties.
    pub(super) async fn start(
        a: &Applied<'_>,
        windows: Option<Box<WindowMaps>>,
        buckets: u32,
        token: Option<crate::feedback::Token>,
        calls: &tokio::sync::mpsc::Sender<crate::control::server::Call>,
        (mut feeds, mut crowdsec): (super::feeds::Feeds, super::crowdsec::CrowdsecSide),
    ) -> anyhow::Result<Self> {
        let feedback = super::start::serve_feedback(a.policy, token, calls).await?;
        let mut forward = forward::Manager::new(buckets, forward::fds::Budget::of_process(FDS_RESERVE));
        forward.apply(a);
        let fleet = FleetSide::start(a.policy.fleet.as_ref(), windows, classes(&a.config, a.class_names, a.policy))?;
        feeds.apply(a);
        crowdsec.apply(a);
        Ok(Self { forward, fleet, feedback, feeds, crowdsec })
    }

    pub(super) fn apply(&mut self, a: &Applied<'_>) {
        self.forward.apply(a);
        self.fleet.apply(a);
        self.feedback.apply(a);
        self.feeds.apply(a);
        self.crowdsec.apply(a);
    }

    pub(super) fn reload(&mut self, a: &Applied<'_>) {
        self.forward.reload(a);
        self.fleet.reload(a);
        self.feedback.reload(a);
        self.feeds.reload(a);
        self.crowdsec.reload(a);
    }

    pub(super) fn tick(&mut self) {
        self.forward.tick();
        self.fleet.tick();
        self.feedback.tick();
        self.feeds.tick();
        self.crowdsec.tick();
    }

    /// Every feature's report, in this order.
    pub(super) fn series(&self) -> Vec<Box<dyn Series>> {
        [
            self.forward.series(),
            self.fleet.series(),
            self.feedback.series(),
            self.feeds.series(),
            self.crowdsec.series(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub(super) async fn drain(&mut self) {
        self.forward.drain().await;
        self.fleet.drain().await;
        self.feedback.drain().await;
        self.feeds.drain().await;
        self.crowdsec.drain().await;
    }
}

impl Feature for Endpoint {
    /// None of its own: its decisions are the governor's, reported with
    /// the policy state.
    fn series(&self) -> Option<Box<dyn Series>> {
        None
    }

    /// Where it listens and its token file take a restart (the token
    /// itself is read again on SIGHUP): nothing to change here.
    fn apply(&mut self, _: &Applied<'_>) {}

    /// Read the token again (a rotated file is taken at once; a bad one
    /// is refused and the old token stays), and say plainly when the
    /// policy's `listen` or `token_file` moved, which takes a restart.
    fn reload(&mut self, a: &Applied<'_>) {
        let Endpoint { bound, token_file: file, token } = self;
        if let Some(f) = &a.policy.feedback
            && ((f.listen.port() != 0 && f.listen != *bound) || f.token_file != *file)
        {
            tracing::warn!(
                event = "feedback_token",
                "limiter: SIGHUP: feedback.listen {} and token_file {} take effect at the next restart; the endpoint stays on http://{bound} with {}",
                f.listen,
                f.token_file.display(),
                file.display()
            );
        }
        match crate::feedback::read_token(file) {
            Ok((t, warnings)) => {
                for w in warnings {
                    tracing::warn!(event = "feedback_token", "limiter: {w}");
                }
                token.replace(&t);
                tracing::info!(
                    event = "feedback_token",
                    "limiter: SIGHUP: feedback token read again from {}",
                    file.display()
                );
            }
            Err(e) => {
                tracing::warn!(event = "feedback_token", "limiter: SIGHUP: {e}; the token in force stays");
            }
        }
    }
}
