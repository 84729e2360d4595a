//! The CrowdSec pulls' series.

use prometheus_client::encoding::DescriptorEncoder;

use super::Status;
use crate::series::{Series, clamp, counters, gauge};

/// The pulls, and what the policy state left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub status: Status,
    /// Decisions left out (cap, width, filters) since the start.
    pub left_out: u64,
}

impl Series for Report {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.status;
        gauge(
            enc,
            "limiter_crowdsec_lapi_up",
            "1 while the last pull of CrowdSec's decision stream succeeded.",
            i64::from(s.up),
        )?;
        gauge(
            enc,
            "limiter_crowdsec_last_pull_timestamp_seconds",
            "Unix time of the last pull of the decision stream that succeeded (0: none yet).",
            clamp(s.last_ok),
        )?;
        counters(
            enc,
            "limiter_crowdsec_pulls",
            "Pulls of the decision stream by result (while they fail, the decisions in force stay).",
            "result",
            [("ok", s.pulls), ("failed", s.failures)],
        )?;
        counters(
            enc,
            "limiter_crowdsec_decisions",
            "Decisions the stream brought, by kind (new, deleted), and those left out (a cap, a width rule, a filter).",
            "kind",
            [("new", s.new), ("deleted", s.deleted), ("left_out", self.left_out)],
        )
    }
}
