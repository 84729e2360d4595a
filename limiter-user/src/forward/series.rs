//! The forwarders' series.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::Report;
use crate::series::{Series, clamp};

/// The forwarders' reports, in the policy's order.
#[derive(Debug, Default)]
pub struct Reports(pub Vec<Report>);

impl Series for Reports {
    /// Per forwarder (labels bounded by the policy: forwarder names and
    /// backend addresses it declares).
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let forwards = &self.0;
        let i = clamp;
        let mut m =
            enc.encode_descriptor("limiter_forward_connections_active", "Connections open.", None, MetricType::Gauge)?;
        for f in forwards {
            ConstGauge::new(i(f.active)).encode(m.encode_family(&[("listener", f.name.as_str())])?)?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_connections",
            "Connections by outcome: forwarded (ended after being spliced), shed (closed at accept), upstream_failed.",
            None,
            MetricType::Counter,
        )?;
        for f in forwards {
            let shed: u64 = f.shed.iter().map(|(_, n)| n).sum();
            for (outcome, n) in [
                ("forwarded", f.completed.saturating_sub(f.backend_failed)),
                ("shed", shed),
                ("upstream_failed", f.backend_failed),
            ] {
                ConstCounter::new(n)
                    .encode(m.encode_family(&[("listener", f.name.as_str()), ("outcome", outcome)])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_local_errors",
            "Connections not forwarded for lack of local resources (EMFILE, ENFILE, ENOBUFS, ENOMEM); never held against an upstream.",
            None,
            MetricType::Counter,
        )?;
        for f in forwards {
            ConstCounter::new(f.local_errors).encode(m.encode_family(&[("listener", f.name.as_str())])?)?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_shed",
            "Connections closed at accept, by reason.",
            None,
            MetricType::Counter,
        )?;
        for f in forwards {
            for (reason, n) in &f.shed {
                ConstCounter::new(*n)
                    .encode(m.encode_family(&[("listener", f.name.as_str()), ("reason", reason.as_str())])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_upstream_up",
            "1 while an upstream is in service.",
            None,
            MetricType::Gauge,
        )?;
        for f in forwards {
            for (addr, up) in &f.backends {
                ConstGauge::new(i64::from(*up))
                    .encode(m.encode_family(&[("listener", f.name.as_str()), ("upstream", addr.as_str())])?)?;
            }
        }
        let mut m =
            enc.encode_descriptor("limiter_forward_bytes", "Bytes spliced, by direction.", None, MetricType::Counter)?;
        for f in forwards {
            for (dir, n) in [("to_upstream", f.bytes_up), ("to_client", f.bytes_down)] {
                ConstCounter::new(n).encode(m.encode_family(&[("listener", f.name.as_str()), ("direction", dir)])?)?;
            }
        }
        shedding(forwards, enc)
    }
}

/// Criticality and adaptive throttling, per forwarder.
fn shedding(forwards: &[super::Report], enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let i = clamp;
    let mut m = enc.encode_descriptor(
        "limiter_forward_criticality",
        "Connections by criticality: let in, or shed at accept (any reason).",
        None,
        MetricType::Counter,
    )?;
    for f in forwards {
        for (c, let_in, shed) in &f.by_criticality {
            for (outcome, n) in [("let_in", *let_in), ("shed", *shed)] {
                ConstCounter::new(n).encode(m.encode_family(&[
                    ("listener", f.name.as_str()),
                    ("criticality", c.as_str()),
                    ("outcome", outcome),
                ])?)?;
            }
        }
    }
    let mut m = enc.encode_descriptor(
            "limiter_forward_adaptive_refuse_probability",
            "Adaptive throttling: the probability a new connection is refused now (0 when the upstreams accept enough), by the window's requests and accepts.",
            None,
            MetricType::Gauge,
        )?;
    for f in forwards {
        if let Some(a) = &f.adaptive {
            ConstGauge::new(a.refuse_probability).encode(m.encode_family(&[("listener", f.name.as_str())])?)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "limiter_forward_adaptive_window",
        "Adaptive throttling's trailing window: requests (refused ones included) and the upstreams' accepts.",
        None,
        MetricType::Gauge,
    )?;
    for f in forwards {
        if let Some(a) = &f.adaptive {
            for (what, n) in [("requests", a.requests), ("accepts", a.accepts)] {
                ConstGauge::new(i(n)).encode(m.encode_family(&[("listener", f.name.as_str()), ("count", what)])?)?;
            }
        }
    }
    Ok(())
}
