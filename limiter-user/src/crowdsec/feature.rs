//! The CrowdSec feature: pulls the decision stream while the policy has
//! a `[crowdsec]` section (a changed section starts over with
//! `startup=true`), each pull sent to the policy state as a change of its
//! own ([`CrowdsecPull`], applied in parts).

use std::sync::{Arc, Weak};

use super::{PART, Pulled, Status, Watch};
use crate::engine::{
    ApplyError, Enforcer,
    decision::{Decision, Sink},
    feature::{Feature, InForce},
    source::SourceChange,
};
use crate::{control::StatusInfo, dataplane::maps::Tables, origin::Named, policy::crowdsec::Crowdsec, series::Series};

/// The pulling task, if the policy asks for one.
#[derive(Debug)]
pub(crate) struct CrowdsecSide {
    /// The section in force (the pulls' changes hold it weakly: a part of
    /// a section no longer in force is dropped) and its task.
    watch: Option<(Arc<Crowdsec>, Watch)>,
    sink: Sink,
    /// Decisions the policy state left out, for the report.
    left_out: u64,
}

impl CrowdsecSide {
    /// The feature, which sends its pulls to `sink`.
    pub(crate) fn new(sink: Sink) -> Self {
        Self { watch: None, sink, left_out: 0 }
    }

    /// One line for `limiter status`: the LAPI up or down, since when.
    fn summary(&self) -> Option<String> {
        let ((spec, _), s) = (self.watch.as_ref()?, self.pulls()?);
        let now = crate::clock::unix_now();
        let ago = |t: u64| if t == 0 { "never".to_owned() } else { format!("{} s ago", now.saturating_sub(t)) };
        Some(if s.up {
            format!("LAPI {} up, last pull {}, {} pulls", spec.lapi_url, ago(s.last_ok), s.pulls)
        } else {
            format!(
                "LAPI {} DOWN for {} pull(s), the decisions in force stay (last good pull {}): {}",
                spec.lapi_url,
                s.failing,
                ago(s.last_ok),
                s.last_error.as_deref().unwrap_or("not pulled yet")
            )
        })
    }

    /// The pulls' status, if pulling.
    fn pulls(&self) -> Option<Status> {
        self.watch.as_ref().map(|(_, w)| w.status())
    }
}

impl Feature for CrowdsecSide {
    /// An unchanged section keeps pulling; a new or changed one starts
    /// over (`startup=true`); none stops.
    fn apply(&mut self, a: &InForce<'_>) {
        self.left_out = a.state.deny_layer().crowdsec().left_out;
        if self.watch.as_ref().map(|(s, _)| &**s) == a.policy.crowdsec.as_ref() {
            return;
        }
        self.watch = a.policy.crowdsec.clone().map(|spec| {
            let spec = Arc::new(spec);
            let held = Arc::downgrade(&spec);
            let watch = Watch::start((*spec).clone(), self.sink.clone(), move |pulled| {
                Decision::Source(Box::new(CrowdsecPull { spec: held.clone(), pulled }))
            });
            (spec, watch)
        });
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        self.pulls().map(|status| Box::new(super::Report { status, left_out: self.left_out }) as Box<dyn Series>)
    }

    fn status(&self, status: &mut StatusInfo) {
        status.crowdsec = self.summary();
    }
}

/// A pull of the decision stream (or a part of one), under the section
/// it was pulled for.
#[derive(Debug)]
struct CrowdsecPull {
    spec: Weak<Crowdsec>,
    pulled: Pulled,
}

impl SourceChange for CrowdsecPull {
    fn origin(&self) -> Named {
        Named::crowdsec("lapi")
    }

    fn run(&mut self, state: &mut Enforcer, tables: &mut Tables) -> Result<String, ApplyError> {
        let Some(spec) = self.spec.upgrade() else { return Ok(String::new()) };
        // The decisions move; the part stays, for `frees_heap`.
        let part = std::mem::take(&mut self.pulled);
        self.pulled.part = part.part;
        state.deny_mut().pull(tables, &spec, part)
    }

    fn parts(self: Box<Self>) -> Vec<Box<dyn SourceChange>> {
        let spec = self.spec;
        self.pulled
            .parts(PART)
            .into_iter()
            .map(|pulled| Box::new(Self { spec: spec.clone(), pulled }) as Box<dyn SourceChange>)
            .collect()
    }

    fn current(&self) -> bool {
        self.spec.strong_count() > 0
    }

    /// After a pull's last part only: trimming a big heap takes time, and
    /// the operator's change may be waiting behind each part.
    fn frees_heap(&self) -> bool {
        self.pulled.part.last
    }

    fn report(&self, result: &Result<String, ApplyError>) {
        match result {
            Ok(line) if line.is_empty() => {}
            Ok(line) => tracing::info!(event = "crowdsec", ok = true, "limiter: {line}"),
            Err(e) => tracing::warn!(event = "crowdsec", ok = false, "limiter: crowdsec: {e}"),
        }
    }
}
