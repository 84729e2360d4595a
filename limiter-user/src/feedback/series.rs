//! The series of the feedback governor, and of escalation and proof of
//! source.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter},
};

use crate::series::{Series, clamp, counter, gauge};

/// What the feedback governor decided since the daemon started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedbackCounts {
    pub applied: u64,
    pub shadowed: u64,
    /// Refusals of the governor, by why.
    pub refused: crate::policy::feedback::Refusals,
}

/// What escalation decided and found since the daemon started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EscalationCounts {
    /// Escalations the daemon decided (then governed like any penalty).
    pub escalations: u64,
    /// Prefix-seconds above the escalation rate whose drops came from
    /// addresses that never proved themselves: dropped, not escalated.
    pub unproven: u64,
    /// Addresses proven now (a verified SYN cookie or a TCP connection
    /// the kernel accepted, within the last 10 minutes).
    pub proven_sources: u64,
    /// Escalations refused at the cap (`feedback.escalate.max_denied`,
    /// or the half of it unbound escalations may hold).
    pub capped: u64,
}

impl Series for FeedbackCounts {
    /// The feedback governor's decisions.
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let f = self;
        let mut m = enc.encode_descriptor(
            "limiter_feedback_decisions",
            "Penalties from the tenant layer by result: applied, shadow, or refused by the governor and why.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(f.applied).encode(m.encode_family(&[("result", "applied")])?)?;
        ConstCounter::new(f.shadowed).encode(m.encode_family(&[("result", "shadow")])?)?;
        for (r, n) in f.refused.iter() {
            let result = format!("refused_{}", r.label());
            ConstCounter::new(n).encode(m.encode_family(&[("result", result.as_str())])?)?;
        }
        Ok(())
    }
}

impl Series for EscalationCounts {
    /// Escalation's decisions and proofs.
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let f = self;
        counter(
            enc,
            "limiter_escalations",
            "Prefixes the daemon's automatic escalation asked to deny (then governed like any penalty).",
            f.escalations,
        )?;
        counter(
            enc,
            "limiter_escalations_unproven",
            "Prefix-seconds above the escalation rate whose drops came from addresses that never proved themselves (a verified SYN cookie or a TCP handshake the kernel accepted): dropped, not escalated.",
            f.unproven,
        )?;
        counter(
            enc,
            "limiter_escalations_capped",
            "Escalations refused at feedback.escalate.max_denied, or held back because escalations whose drops were not of connections this host holds fill their half of it.",
            f.capped,
        )?;
        gauge(
            enc,
            "limiter_proven_sources",
            "Source addresses proven now (a verified SYN cookie or a TCP handshake the kernel accepted in the last 10 minutes); only their drops count toward escalation.",
            clamp(f.proven_sources),
        )?;
        Ok(())
    }
}
