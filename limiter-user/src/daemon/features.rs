//! The daemon's features as one list it walks in order (see
//! [`Feature`]): started in [`Features::start`], the one place that
//! names them.

use crate::engine::{
    changes::Change,
    decision::Sink,
    feature::{Applied, Feature, InForce, Sample, Second},
};
use crate::{
    control::{ErrorCode, PrefixShow, Request, Response, StatusInfo, server::Call},
    crowdsec::feature::CrowdsecSide,
    dataplane::maps::WindowMaps,
    feedback::Token,
    fleet::feature::{FleetSide, classes},
    forward,
    series::Series,
    upstream::feature::UpstreamSide,
};

/// Descriptors the forwarders leave to the rest of the daemon: each
/// listener's connection cap, and room for the maps, files and clients
/// (fleet store, CrowdSec, feeds) it opens later.
const FDS_RESERVE: usize =
    crate::control::server::MAX_CONNS + crate::metrics::MAX_CONNS + crate::feedback::MAX_CONNS + 64;

/// What the features start with besides the policy in force.
pub(super) struct Start<'a> {
    /// The window-quota maps (the fleet sync takes them).
    pub(super) windows: Option<Box<WindowMaps>>,
    /// The tunnels' maps.
    pub(super) tunnel: Option<Box<crate::tunnel::maps::TunnelMaps>>,
    /// The id of the bucket map the forwarders read.
    pub(super) buckets: u32,
    /// The feedback endpoint's token, checked before anything was attached.
    pub(super) token: Option<Token>,
    /// Where the feedback endpoint sends its penalties (as requests,
    /// routed down the path of decisions like the operator's).
    pub(super) calls: &'a tokio::sync::mpsc::Sender<Call>,
    /// Where the sources of decisions send their changes.
    pub(super) sink: &'a Sink,
    /// The interface (the upstream feature reads its received bytes).
    pub(super) iface: &'a str,
    /// The audit trail's history file.
    pub(super) history: Option<std::path::PathBuf>,
    /// The attacks file.
    pub(super) attacks: Option<std::path::PathBuf>,
}

/// The daemon's features, in the order they are told a policy.
pub(super) struct Features(Vec<Box<dyn Feature>>);

impl Features {
    /// Start every feature the policy in force declares.
    pub(super) async fn start(a: &InForce<'_>, s: Start<'_>) -> anyhow::Result<Self> {
        let mut list: Vec<Box<dyn Feature>> = vec![
            Box::new(forward::Manager::new(s.buckets, forward::fds::Budget::of_process(FDS_RESERVE))),
            Box::new(FleetSide::start(
                a.policy.fleet.as_ref(),
                s.windows,
                classes(&a.config, a.class_names, a.policy),
            )?),
            Box::new(super::start::serve_feedback(a.policy, s.token, s.calls).await?),
            Box::new(crate::feeds::feature::Feeds::new(s.sink.clone())),
            Box::new(crate::groups::feature::Groups::new(s.sink.clone())),
            Box::new(crate::sources::feature::Sources::new(s.sink.clone())),
            Box::new(CrowdsecSide::new(s.sink.clone())),
            Box::new(UpstreamSide::new(s.iface)),
            Box::new(crate::feedback::escalation::Escalation::new(s.sink.clone())),
            Box::new(crate::cookies::feature::Cookies::default()),
            Box::new(crate::tcp_state::feature::TcpStateFeature::default()),
            Box::new(crate::tunnel::feature::Tunnels::new(s.tunnel)),
            Box::new(crate::trail::feature::Trail::start(s.history)),
            Box::new(crate::attacks::feature::AttacksFeature::start(s.attacks)),
        ];
        for f in &mut list {
            f.apply(a);
        }
        Ok(Self(list))
    }

    pub(super) fn apply(&mut self, a: &InForce<'_>) {
        self.0.iter_mut().for_each(|f| f.apply(a));
    }

    pub(super) fn reload(&mut self, a: &InForce<'_>) {
        self.0.iter_mut().for_each(|f| f.reload(a));
    }

    /// Tick every feature, then tell every feature what each noted.
    pub(super) fn tick(&mut self, second: &Second<'_>) {
        self.0.iter_mut().for_each(|f| f.tick(second));
        let notes: Vec<_> = self.0.iter_mut().flat_map(|f| f.notes()).collect();
        for n in &notes {
            self.0.iter_mut().for_each(|f| f.noted(n));
        }
    }

    pub(super) fn sampled(&mut self, sample: &Sample) {
        self.0.iter_mut().for_each(|f| f.sampled(sample));
    }

    pub(super) fn frames(&mut self, frames: &[crate::capture::Frame], class_names: &[String]) {
        self.0.iter_mut().for_each(|f| f.frames(frames, class_names));
    }

    /// Networks some feature wants described, each with who asked (by
    /// index), [`crate::engine::feature::DESCRIBED`] at most.
    pub(super) fn wants_described(&mut self) -> Vec<(usize, ipnet::IpNet)> {
        let mut out = Vec::new();
        for (i, f) in self.0.iter_mut().enumerate() {
            out.extend(f.wants_described().into_iter().map(|n| (i, n)));
        }
        out.truncate(crate::engine::feature::DESCRIBED);
        out
    }

    /// Tell feature `i` what the features said of `net`.
    pub(super) fn described(&mut self, i: usize, net: ipnet::IpNet, show: &PrefixShow) {
        if let Some(f) = self.0.get_mut(i) {
            f.described(net, show);
        }
    }

    /// What every feature wants copied.
    pub(super) fn wants_frames(&self) -> Vec<crate::capture::Want> {
        self.0.iter().filter_map(|f| f.wants_frames()).collect()
    }

    /// The passed frames a second every feature wants copied.
    pub(super) fn wants_passes(&self) -> Vec<u64> {
        self.0.iter().filter_map(|f| f.wants_passes()).collect()
    }

    /// Whether every feature can carry out its part of the operator's
    /// `change` (see [`Feature::admits`]).
    pub(super) fn admits(&self, change: &Change) -> Result<(), (ErrorCode, String)> {
        self.0.iter().try_for_each(|f| f.admits(change))
    }

    pub(super) fn applied(&mut self, applied: &mut Applied<'_>) {
        self.0.iter_mut().for_each(|f| f.applied(applied));
    }

    /// The settings in force that the policy file says otherwise (see
    /// [`Feature::in_force`]).
    pub(super) fn in_force(&self, policy: &mut crate::policy::Policy, note: &mut String) {
        self.0.iter().for_each(|f| f.in_force(policy, note));
    }

    /// Every feature's report, in order.
    pub(super) fn series(&self) -> Vec<Box<dyn Series>> {
        self.0.iter().filter_map(|f| f.series()).collect()
    }

    pub(super) fn status(&self, status: &mut StatusInfo) {
        self.0.iter().for_each(|f| f.status(status));
    }

    pub(super) fn top(&self, top: &mut crate::control::TopInfo) {
        self.0.iter().for_each(|f| f.top(top));
    }

    /// What every feature says of a bucket prefix, in order.
    pub(super) fn show(&self, src: &limiter_common::packet::Source, a: &InForce<'_>, out: &mut PrefixShow) {
        self.0.iter().for_each(|f| f.show(src, a, out));
    }

    /// The answer of the feature whose request `req` (of `by`) is, if
    /// any; every feature hears of it.
    pub(super) fn answer(&mut self, req: &Request, by: &crate::control::server::Requester) -> Option<Response> {
        let answer = self.0.iter_mut().find_map(|f| f.answer(req))?;
        self.0.iter_mut().for_each(|f| f.answered(req, by, &answer));
        Some(answer)
    }

    pub(super) async fn drain(&mut self) {
        for f in &mut self.0 {
            f.drain().await;
        }
    }
}
