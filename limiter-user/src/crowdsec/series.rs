//! The CrowdSec pulls' series.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter},
};

use super::Status;
use crate::series::{Series, clamp, gauge};

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
        let mut m = enc.encode_descriptor(
            "limiter_crowdsec_pulls",
            "Pulls of the decision stream by result (while they fail, the decisions in force stay).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.pulls).encode(m.encode_family(&[("result", "ok")])?)?;
        ConstCounter::new(s.failures).encode(m.encode_family(&[("result", "failed")])?)?;
        let mut m = enc.encode_descriptor(
            "limiter_crowdsec_decisions",
            "Decisions the stream brought, by kind (new, deleted), and those left out (a cap, a width rule, a filter).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.new).encode(m.encode_family(&[("kind", "new")])?)?;
        ConstCounter::new(s.deleted).encode(m.encode_family(&[("kind", "deleted")])?)?;
        ConstCounter::new(self.left_out).encode(m.encode_family(&[("kind", "left_out")])?)?;
        Ok(())
    }
}
