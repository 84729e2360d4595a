//! The CrowdSec feature: pulls the decision stream while the policy has
//! a `[crowdsec]` section (a changed section starts over with
//! `startup=true`), each pull handed to the policy state as a change.

use tokio::sync::mpsc;

use super::feature::{Applied, Feature};
use crate::{
    crowdsec::{Pulled, Status, Watch},
    policy::crowdsec::Crowdsec,
    series::Series,
};

/// The pulling task, if the policy asks for one.
#[derive(Debug)]
pub(super) struct CrowdsecSide {
    watch: Option<Watch>,
    tx: mpsc::Sender<Pulled>,
    /// Decisions the policy state left out (from the view), for the report.
    pub(super) left_out: u64,
}

impl CrowdsecSide {
    /// The feature, and where its pulls arrive (the daemon's loop).
    pub(super) fn new() -> (Self, mpsc::Receiver<Pulled>) {
        let (tx, rx) = mpsc::channel(1);
        (Self { watch: None, tx, left_out: 0 }, rx)
    }

    /// The section the pulls run under.
    pub(super) fn spec(&self) -> Option<&Crowdsec> {
        self.watch.as_ref().map(|w| &w.spec)
    }

    /// One line for `limiter status`: the LAPI up or down, since when.
    pub(super) fn summary(&self) -> Option<String> {
        let (w, s) = (self.watch.as_ref()?, self.status()?);
        let now = crate::clock::unix_now();
        let ago = |t: u64| if t == 0 { "never".to_owned() } else { format!("{} s ago", now.saturating_sub(t)) };
        Some(if s.up {
            format!("LAPI {} up, last pull {}, {} pulls", w.spec.lapi_url, ago(s.last_ok), s.pulls)
        } else {
            format!(
                "LAPI {} DOWN for {} pull(s), the decisions in force stay (last good pull {}): {}",
                w.spec.lapi_url,
                s.failing,
                ago(s.last_ok),
                s.last_error.as_deref().unwrap_or("not pulled yet")
            )
        })
    }

    /// The pulls' status, if pulling.
    pub(super) fn status(&self) -> Option<Status> {
        self.watch.as_ref().map(Watch::status)
    }
}

impl Feature for CrowdsecSide {
    /// An unchanged section keeps pulling; a new or changed one starts
    /// over (`startup=true`); none stops.
    fn apply(&mut self, a: &Applied<'_>) {
        if self.spec() == a.policy.crowdsec.as_ref() {
            return;
        }
        self.watch = a.policy.crowdsec.clone().map(|s| Watch::start(s, self.tx.clone()));
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        self.status()
            .map(|status| Box::new(crate::crowdsec::Report { status, left_out: self.left_out }) as Box<dyn Series>)
    }
}
