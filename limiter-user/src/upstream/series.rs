//! The upstream rules' series.

use std::collections::BTreeMap;

use prometheus_client::encoding::DescriptorEncoder;

use super::{Pressure, by_word, speaker::Status};
use crate::origin::Origin;
use crate::series::{Series, clamp, counter, counters, gauge, gauges};

/// What the upstream feature reports at a scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamReport {
    pub status: Status,
    pub by_trigger: [(Origin, usize); 3],
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
        gauges(
            enc,
            "limiter_upstream_session_up",
            "1 while the speaker's BGP session with the neighbour is established.",
            "neighbor",
            s.neighbours.iter().map(|(n, up)| (n.as_str(), i64::from(*up))),
        )?;
        gauges(
            enc,
            "limiter_upstream_rules",
            "Rules wanted announced upstream, by trigger (operator, escalation, pressure).",
            "trigger",
            self.by_trigger.iter().map(|(t, n)| (by_word(*t), clamp(*n as u64))),
        )?;
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
        counters(
            enc,
            "limiter_upstream_changes",
            "Announcements and withdrawals the speaker took.",
            "change",
            [("announce", s.announcements), ("withdraw", s.withdrawals)],
        )?;
        counter(enc, "limiter_upstream_failures", "Commands the speaker refused or did not answer.", s.failures)?;
        counter(
            enc,
            "limiter_upstream_reannounced",
            "Times the speaker was found without routes it had been given (a restart) and given them again.",
            s.reannounced,
        )?;
        counters(
            enc,
            "limiter_upstream_refused",
            "Rules not announced, by reason (protected, too_wide, cap, not_allowed, outranked).",
            "reason",
            self.refused.iter().map(|(reason, n)| (*reason, *n)),
        )?;
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
