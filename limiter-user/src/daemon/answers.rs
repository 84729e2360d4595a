//! The daemon's answers to control requests and metrics scrapes.

use limiter_common::{Action, Reason};

use super::{features::Features, link::Link, observe::Observer, reloads::Reloads, show, view::View};
use crate::engine::{ApplyError, Enforcer, Settings};
use crate::{
    clock::unix_now,
    control::{
        ClassRow, ErrorCode, GroupRate, Offender, PolicyText, PrefixList, ReasonRow, Request, Response, StatsInfo,
        StatusInfo, SynCookieRow, TcpStateRow, TopInfo,
    },
    dataplane::{DataPlane, Health, LoadError},
    metrics::Snapshot,
    policy::file,
    top,
};

/// What the loop's read-only answers read: its parts, borrowed for one
/// answer (the changes and the clients' turns are the loop's).
pub(super) struct Answers<'a> {
    pub(super) settings: &'a Settings,
    pub(super) dp: &'a DataPlane,
    /// The policy state; `None` while a change has it away.
    pub(super) policy: Option<&'a Enforcer>,
    pub(super) view: &'a View,
    pub(super) link: &'a Link,
    pub(super) features: &'a Features,
    pub(super) reloads: &'a Reloads,
    pub(super) observer: &'a Observer,
    /// What capture copies now, said (`Capturing::describe`).
    pub(super) capture: &'a str,
}

impl Answers<'_> {
    /// The answer to a request that reads (a change or a feature's own
    /// request is taken before); `Err` gives back one that needs the
    /// policy state while a change has it away.
    pub(super) fn answer(&self, req: Request) -> Result<Response, Request> {
        let fail = |e: &dyn std::fmt::Display| Response::error(ErrorCode::Unavailable, e.to_string());
        Ok(match req {
            Request::Status => self.status().unwrap_or_else(|e| fail(&e)),
            Request::Stats => self.stats().unwrap_or_else(|e| fail(&e)),
            Request::Top { n } => self.top_info(n),
            // Asked of the policy state: they wait while a change has it.
            Request::PrefixShow { .. } | Request::Explain { .. } if self.policy.is_none() => return Err(req),
            Request::PrefixShow { cidr } => show::prefix_show(self.policy, self.view, self.features, cidr)
                .map_or_else(|e| fail(&e), Response::PrefixShow),
            Request::Explain { addr, protocol, port, syn } => {
                let asked = super::explain::Asked { addr, protocol, port, syn };
                super::explain::explain(self.policy, self.view, self.features, self.dp, asked)
                    .map_or_else(|e| fail(&e), |e| Response::Explain(Box::new(e)))
            }
            Request::PolicyShow | Request::PrefixList => {
                let Some(policy) = self.policy else {
                    return Err(req);
                };
                if matches!(req, Request::PolicyShow) {
                    // What is in force: a feature's settings that take a
                    // restart are the ones it started with, said where the
                    // file says otherwise.
                    let mut p = policy.effective(policy.base());
                    let mut note = String::new();
                    self.features.in_force(&mut p, &mut note);
                    Response::Policy(PolicyText {
                        version: policy.version(),
                        source: policy.source().to_owned(),
                        text: note + &file::render(&p),
                    })
                } else {
                    let mut entries = policy.prefixes();
                    let (decisions, more) = policy.deny_layer().entries(crate::control::MAX_LISTED_DECISIONS);
                    entries.extend(decisions);
                    Response::Prefixes(PrefixList { version: policy.version(), entries, more })
                }
            }
            Request::PolicyApply { .. }
            | Request::PrefixSet { .. }
            | Request::PrefixAllow { .. }
            | Request::PrefixDeny { .. }
            | Request::PrefixUnset { .. }
            | Request::PrefixUnsetAll { .. }
            | Request::PrefixLoad { .. }
            | Request::Penalty { .. } => unreachable!("changes are taken before"),
            Request::CaptureOpen { .. } | Request::CaptureRead { .. } | Request::CaptureClose { .. } => {
                unreachable!("captures are answered before")
            }
            Request::Load { .. }
            | Request::History { .. }
            | Request::Attacks { .. }
            | Request::FleetStatus
            | Request::UpstreamList
            | Request::UpstreamAnnounce { .. }
            | Request::UpstreamWithdraw { .. }
            | Request::Tunnels
            | Request::BackendDrain { .. } => {
                Response::error(ErrorCode::Unavailable, "no feature of this daemon answers it".to_owned())
            }
        })
    }

    /// The counters per reason, and per class of the running policy by
    /// name, read together.
    fn counters(&self) -> Result<(crate::dataplane::Totals, Vec<(String, limiter_common::ClassCounters)>), LoadError> {
        let (t, per_class) = self.dp.maps.counters.read()?;
        Ok((t, self.view.class_names.iter().cloned().zip(per_class).collect()))
    }

    /// Each class with SYN cookies and whether they are engaged now.
    pub(super) fn syn_cookie_states(&self) -> Result<Vec<SynCookieRow>, LoadError> {
        use limiter_common::cookie::mode;
        let now = crate::dataplane::maps::monotonic_coarse_ns();
        let mut out = Vec::with_capacity(self.view.syn_cookies.len());
        for (class, name, m) in &self.view.syn_cookies {
            let (label, on) = match *m {
                mode::ALWAYS => (crate::policy::SynCookies::Always, self.view.syn_cookies_on),
                _ => (
                    crate::policy::SynCookies::Auto,
                    self.view.syn_cookies_on && self.dp.maps.counters.syn_cookies_engaged(*class, now)?,
                ),
            };
            out.push(SynCookieRow { class: name.clone(), mode: label, engaged: on });
        }
        Ok(out)
    }

    /// Each class that judges out-of-state TCP, and whether it does now.
    pub(super) fn tcp_states(&self) -> Result<Vec<TcpStateRow>, LoadError> {
        use limiter_common::tcp_state::mode;
        let now = crate::dataplane::maps::monotonic_coarse_ns();
        let mut out = Vec::with_capacity(self.view.tcp_state.len());
        for (class, name, m) in &self.view.tcp_state {
            let (label, on) = match *m {
                mode::ALWAYS => (crate::policy::TcpState::Always, true),
                _ => (crate::policy::TcpState::Auto, self.dp.maps.counters.tcp_state_engaged(*class, now)?),
            };
            out.push(TcpStateRow { class: name.clone(), mode: label, engaged: on });
        }
        Ok(out)
    }

    /// Numbers for one metrics scrape, read from the kernel now.
    pub(super) fn snapshot(&self) -> Result<Snapshot, LoadError> {
        let (totals, classes) = self.counters()?;
        Ok(Snapshot {
            totals,
            classes,
            policy_version: self.view.version,
            capacity: self.dp.capacity(),
            tracked: self.observer.tracked(),
            iface: self.settings.iface.clone(),
            attach_mode: self.settings.mode.to_string(),
            attached: self.link.health == Health::Attached,
            reattaches: self.link.repairs,
            features: {
                // The governor's decisions (the policy state's) after the
                // features'.
                let mut f = self.features.series();
                f.push(Box::new(self.view.feedback));
                f.push(Box::new(self.deny_report()?));
                if !self.view.groups.is_empty() {
                    let hits = self.dp.maps.counters.group_hits(self.view.groups.len())?;
                    f.push(Box::new(crate::groups::GroupHitsReport(
                        self.view.groups.iter().zip(hits).map(|(n, h)| (n.clone(), h.passed, h.dropped)).collect(),
                    )));
                }
                f
            },
            syn_cookies: self.syn_cookie_states()?,
            tcp_state: self.tcp_states()?,
            without_syn_cookies: self.dp.kernel.lacks.is_some(),
            reloads_ok: self.reloads.applied,
            reloads_failed: self.reloads.rejected,
            control_refused: super::reloads::VERBS.iter().copied().zip(self.reloads.refused).collect(),
            last_reload_ok: self.reloads.last_applied,
            last_reload_failed: self.reloads.last_rejected,
        })
    }

    /// The deny set's series: networks and drops by origin, and each
    /// feed's versions.
    fn deny_report(&self) -> Result<crate::engine::enforcer::deny::series::DenyReport, LoadError> {
        let hits = if self.view.deny.is_empty() { Vec::new() } else { self.dp.maps.counters.deny_hits()? };
        Ok(crate::engine::enforcer::deny::series::DenyReport {
            origins: self
                .view
                .deny
                .iter()
                .map(|(i, name, n)| (name.clone(), *n, hits.get(usize::from(*i)).copied().unwrap_or(0)))
                .collect(),
        })
    }

    fn status(&self) -> Result<Response, LoadError> {
        let t = self.dp.maps.totals()?;
        let mut status = StatusInfo {
            iface: self.settings.iface.clone(),
            attach_mode: self.settings.mode.to_string(),
            attached: self.link.health == Health::Attached,
            detached_reason: match &self.link.health {
                Health::Attached => None,
                Health::Detached(why) => Some(why.clone()),
            },
            reattaches: self.link.repairs,
            forwards: Vec::new(),
            pin_dir: self.settings.pin_dir.as_ref().map(|p| p.display().to_string()),
            policy_version: self.view.version,
            policy_source: self.view.source.clone(),
            policy: self.view.summary.clone(),
            capacity: self.dp.capacity(),
            tracked: self.observer.tracked(),
            tracked_at_ms: self.observer.tracked_at_ms(),
            passed_packets: t.passed().packets,
            dropped_packets: t.dropped().packets,
            uptime_secs: self.reloads.started.elapsed().as_secs(),
            last_reload: self.reloads.last.clone(),
            syn_cookies_failing: None,
            tcp_state_judging: Vec::new(),
            kernel_lacks: self.dp.kernel.lacks.clone(),
            dispatcher: self.link.attachment.chained().map(|c| {
                let others = match crate::dataplane::libxdp::on_interface(c.ifindex) {
                    Ok(crate::dataplane::libxdp::OnInterface::Dispatcher { components, .. }) => {
                        components.into_iter().filter(|p| p.id != c.id).map(|p| (p.name, p.id, p.priority)).collect()
                    }
                    _ => Vec::new(),
                };
                (c.priority, others)
            }),
            deny_set: self.view.deny.iter().map(|(_, name, n)| (name.clone(), *n)).collect(),
            crowdsec: None,
            upstream: None,
            attacks: None,
            capture: Some(self.capture.to_owned()),
            tunnels: None,
        };
        self.features.status(&mut status);
        Ok(Response::Status(status))
    }

    fn stats(&self) -> Result<Response, LoadError> {
        let (t, classes) = self.counters()?;
        let reasons = Reason::ALL
            .iter()
            .map(|r| {
                let c = t.get(*r);
                ReasonRow {
                    reason: r.label().into(),
                    verdict: r.verdict().label().into(),
                    action: r.action().label().into(),
                    packets: c.packets,
                    bytes: c.bytes,
                }
            })
            .collect();
        let classes = classes
            .into_iter()
            .map(|(class, c)| ClassRow {
                class,
                admitted: c.get(Action::Pass).packets,
                dropped: c.get(Action::Drop).packets,
                shadow_dropped: c.get(Action::ShadowDrop).packets,
            })
            .collect();
        let syn_cookies = self.syn_cookie_states()?;
        let tcp_state = self.tcp_states()?;
        Ok(Response::Stats(StatsInfo { reasons, classes, syn_cookies, tcp_state }))
    }

    /// The top offenders (the loop drains the drop events first).
    fn top_info(&self, n: usize) -> Response {
        let names = &self.view.class_names;
        let listed = |t: &top::Tracker| -> Vec<Offender> {
            t.offenders(unix_now(), n.min(100))
                .into_iter()
                .map(|(k, rate)| Offender {
                    prefix: crate::dataplane::net(&k),
                    class: names.get(usize::from(k.class)).cloned().unwrap_or_else(|| k.class.to_string()),
                    drops_per_sec: rate,
                })
                .collect()
        };
        let (offenders, shadow) = (listed(&self.observer.top), listed(&self.observer.shadow));
        let history = self.observer.top.history();
        let mut info = TopInfo {
            window_secs: top::WINDOW_SECS,
            sample_every: top::DROP_SAMPLE,
            passed_per_sec: history.iter().map(|h| h.0).collect(),
            dropped_per_sec: history.iter().map(|h| h.1).collect(),
            offenders,
            shadow,
            groups: self
                .view
                .groups
                .iter()
                .zip(self.observer.group_rates())
                .map(|(name, (passed, dropped))| GroupRate {
                    group: name.clone(),
                    passed_per_sec: *passed,
                    dropped_per_sec: *dropped,
                })
                .collect(),
            backends: Vec::new(),
        };
        self.features.top(&mut info);
        Response::Top(info)
    }
}

impl ApplyError {
    /// The answer to the client that asked for a change this refused
    /// (`version`: the policy that keeps running).
    #[must_use]
    pub fn answer(&self, version: u64) -> Response {
        use crate::policy::feedback::Refusal;
        let (code, entry, message) = match self {
            ApplyError::Entry { index, message } => (ErrorCode::Refused, Some(*index), message.clone()),
            ApplyError::Governor { refusal: Refusal::Cap, .. } => (ErrorCode::Capped, None, self.to_string()),
            ApplyError::Governor { refusal: Refusal::Allowed, .. } => (ErrorCode::Conflict, None, self.to_string()),
            _ => (ErrorCode::Refused, None, self.to_string()),
        };
        Response::Error { code, message: format!("{message}; policy v{version} keeps running"), entry }
    }
}
