//! The daemon's answers to control requests and metrics scrapes.

use limiter_common::{Action, Reason};

use super::{ApplyError, Daemon, observe::unix_now};
use crate::{
    control::{
        Applied, ClassRow, Offender, PolicyText, PrefixList, ReasonRow, Request, Response, StatsInfo, StatusInfo,
        TopInfo,
    },
    dataplane::{LoadError, PolicyMaps as _},
    metrics::Snapshot,
    policy::{Limit, OverrideAction, file},
    top,
};

impl Daemon {
    /// Answer one control request.
    pub(super) fn answer(&mut self, req: Request) -> Response {
        let fail = |e: &dyn std::fmt::Display| Response::Error { message: e.to_string() };
        match req {
            Request::Status => self.status().unwrap_or_else(|e| fail(&e)),
            Request::Stats => self.stats().unwrap_or_else(|e| fail(&e)),
            Request::PolicyShow => Response::Policy(PolicyText {
                version: self.policy.version(),
                source: self.policy.source().to_owned(),
                text: file::render(&self.policy.effective(self.policy.base())),
            }),
            Request::PolicyApply { name, text } => {
                let loaded = match text {
                    Some(t) => file::parse(&name, t),
                    None => self.settings.load_policy(),
                };
                let result = loaded.map_err(ApplyError::from).and_then(|l| self.policy.apply(&mut self.dp, l));
                self.finish_change(result)
            }
            Request::PrefixList => {
                Response::Prefixes(PrefixList { version: self.policy.version(), entries: self.policy.prefixes() })
            }
            Request::PrefixSet { cidr, rate, burst } => {
                let d = self.policy.base().default;
                let limit = Limit { rate, burst, cost: d.cost, mode: d.mode };
                self.change_prefix(&cidr, Some(OverrideAction::Limit(limit)))
            }
            Request::PrefixAllow { cidr } => self.change_prefix(&cidr, Some(OverrideAction::Allow)),
            Request::PrefixDeny { cidr } => self.change_prefix(&cidr, Some(OverrideAction::Deny)),
            Request::PrefixUnset { cidr } => self.change_prefix(&cidr, None),
            Request::Top { n } => self.top_info(n),
        }
    }

    fn change_prefix(&mut self, cidr: &str, action: Option<OverrideAction>) -> Response {
        let result = self.policy.change_prefix(&mut self.dp, cidr, action);
        self.finish_change(result)
    }

    /// Log and record a policy change; the answer to its client.
    fn finish_change(&mut self, result: Result<String, ApplyError>) -> Response {
        let version = self.policy.version();
        match result {
            Ok(summary) => {
                tracing::info!(event = "policy_change", version, "limiter: applied {summary}");
                self.note_reload(true, summary.clone());
                Response::Applied(Applied { version, summary })
            }
            Err(e) => {
                let message = format!("{e}; policy v{version} keeps running");
                self.note_reload(false, message.clone());
                Response::Error { message }
            }
        }
    }

    /// Each class of the running policy by name, with its counters.
    fn class_counters(&self) -> Result<Vec<(String, limiter_common::ClassCounters)>, LoadError> {
        let per_class = self.dp.class_totals()?;
        Ok(self.policy.base().class_names().iter().zip(per_class).map(|(n, c)| ((*n).to_owned(), c)).collect())
    }

    /// Numbers for one metrics scrape, read from the kernel now.
    pub(super) fn snapshot(&self) -> Result<Snapshot, LoadError> {
        Ok(Snapshot {
            totals: self.dp.totals()?,
            classes: self.class_counters()?,
            policy_version: self.policy.version(),
            capacity: self.dp.capacity(),
            tracked: self.observer.tracked(),
            iface: self.settings.iface.clone(),
            attach_mode: self.settings.mode.to_string(),
            reloads_ok: self.reloads.count[0],
            reloads_failed: self.reloads.count[1],
            last_reload_ok: self.reloads.at[0],
            last_reload_failed: self.reloads.at[1],
        })
    }

    fn status(&self) -> Result<Response, LoadError> {
        let t = self.dp.totals()?;
        let version = self.policy.version();
        Ok(Response::Status(StatusInfo {
            iface: self.settings.iface.clone(),
            attach_mode: self.settings.mode.to_string(),
            pin_dir: self.settings.pin_dir.as_ref().map(|p| p.display().to_string()),
            policy_version: version,
            policy_source: self.policy.source().to_owned(),
            policy: self.policy.effective(self.policy.base()).summary(version).to_string(),
            capacity: self.dp.capacity(),
            tracked: self.observer.tracked(),
            passed_packets: t.passed().packets,
            dropped_packets: t.dropped().packets,
            uptime_secs: self.started.elapsed().as_secs(),
            last_reload: self.reloads.last.clone(),
        }))
    }

    fn stats(&self) -> Result<Response, LoadError> {
        let t = self.dp.totals()?;
        let reasons = Reason::ALL
            .iter()
            .map(|r| {
                let c = t.get(*r);
                ReasonRow {
                    reason: r.label().into(),
                    verdict: r.verdict().label().into(),
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
                admitted: c.get(Action::Pass).packets,
                dropped: c.get(Action::Drop).packets,
                shadow_dropped: c.get(Action::ShadowDrop).packets,
            })
            .collect();
        Ok(Response::Stats(StatsInfo { reasons, classes }))
    }

    fn top_info(&mut self, n: usize) -> Response {
        self.observer.drain_drop_events();
        let names = self.policy.base().class_names();
        let offenders = self
            .observer
            .top
            .offenders(unix_now(), n.min(100))
            .into_iter()
            .map(|(k, rate)| Offender {
                prefix: top::cidr(&k),
                class: names.get(usize::from(k.class)).map_or_else(|| k.class.to_string(), |s| (*s).to_owned()),
                drops_per_sec: rate,
            })
            .collect();
        let history = self.observer.top.history();
        Response::Top(TopInfo {
            window_secs: top::WINDOW_SECS,
            sample_every: top::DROP_SAMPLE,
            passed_per_sec: history.iter().map(|h| h.0).collect(),
            dropped_per_sec: history.iter().map(|h| h.1).collect(),
            offenders,
        })
    }
}
