//! The upstream rules' series.

use std::collections::BTreeMap;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{Pressure, Trigger, speaker::Status};
use crate::series::{Series, clamp, counter, gauge};

/// What the upstream feature reports at a scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamReport {
    pub status: Status,
    pub by_trigger: [(Trigger, usize); 3],
    pub max_rules: usize,
    pub refused: BTreeMap<&'static str, u64>,
    pub pressure: Pressure,
    pub shadow: bool,
}

impl Series for UpstreamReport {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let s = &self.status;
        gauge(
            enc,
            "limiter_upstream_speaker_up",
            "1 while the BGP speaker answers on its pipes.",
            i64::from(s.speaker_up),
        )?;
        let mut m = enc.encode_descriptor(
            "limiter_upstream_session_up",
            "1 while the speaker's BGP session with the neighbour is established.",
            None,
            MetricType::Gauge,
        )?;
        for (n, up) in &s.neighbours {
            ConstGauge::new(i64::from(*up)).encode(m.encode_family(&[("neighbor", n.as_str())])?)?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_upstream_rules",
            "Rules wanted announced upstream, by trigger (operator, escalation, pressure).",
            None,
            MetricType::Gauge,
        )?;
        for (t, n) in self.by_trigger {
            ConstGauge::new(clamp(n as u64)).encode(m.encode_family(&[("trigger", t.name())])?)?;
        }
        gauge(
            enc,
            "limiter_upstream_max_rules",
            "upstream.max_rules: the most rules announced at once.",
            clamp(self.max_rules as u64),
        )?;
        gauge(
            enc,
            "limiter_upstream_announced",
            "Rules the speaker holds for the daemon (0 in shadow mode).",
            clamp(s.announced as u64),
        )?;
        gauge(
            enc,
            "limiter_upstream_pending",
            "Rules wanted and not sent yet (the change budget, the speaker down).",
            clamp(s.pending as u64),
        )?;
        gauge(
            enc,
            "limiter_upstream_shadow",
            "1 while upstream.shadow: rules are logged, not announced.",
            i64::from(self.shadow),
        )?;
        let mut m = enc.encode_descriptor(
            "limiter_upstream_changes",
            "Announcements and withdrawals the speaker took.",
            None,
            MetricType::Counter,
        )?;
        for (change, n) in [("announce", s.announcements), ("withdraw", s.withdrawals)] {
            ConstCounter::new(n).encode(m.encode_family(&[("change", change)])?)?;
        }
        counter(enc, "limiter_upstream_failures", "Commands the speaker refused or did not answer.", s.failures)?;
        counter(
            enc,
            "limiter_upstream_reannounced",
            "Times the speaker was found without routes it had been given (a restart) and given them again.",
            s.reannounced,
        )?;
        let mut m = enc.encode_descriptor(
            "limiter_upstream_refused",
            "Rules not announced, by reason (protected, too_wide, cap, not_allowed, outranked).",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in &self.refused {
            ConstCounter::new(*n).encode(m.encode_family(&[("reason", *reason)])?)?;
        }
        let p = &self.pressure;
        gauge(
            enc,
            "limiter_upstream_link_received_bits_per_second",
            "Bits the interface received in the last second (with link_capacity).",
            clamp(p.rx_bits_per_sec),
        )?;
        gauge(
            enc,
            "limiter_upstream_link_pressure",
            "1 while link pressure is sustained and pressure rules are kept.",
            i64::from(p.pressured),
        )
    }
}
