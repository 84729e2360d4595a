//! The tunnels' series: per backend, what was forwarded and whether it
//! is in the table; per tunnel, its backends up; the packets not
//! forwarded, by outcome.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{OUTCOMES, TunnelsInfo};
use crate::series::{Series, clamp};

/// A second's report (labels bounded by the policy: tunnel names and
/// backend addresses it declares).
#[derive(Debug)]
pub struct TunnelReport(pub TunnelsInfo);

impl Series for TunnelReport {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let t = &self.0.tunnels;
        for (name, help, bytes) in [
            ("limiter_forward_tunnel_packets", "Packets forwarded at the driver, by tunnel and backend.", false),
            ("limiter_forward_tunnel_bytes", "Bytes of the inner packets forwarded at the driver.", true),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for tun in t {
                for b in &tun.backends {
                    let addr = b.address.to_string();
                    ConstCounter::new(if bytes { b.bytes } else { b.packets })
                        .encode(m.encode_family(&[("tunnel", tun.name.as_str()), ("backend", addr.as_str())])?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_tunnel_backend_state",
            "1 for the state each backend is in: up (in the table), down (its health check fails), drained.",
            None,
            MetricType::Gauge,
        )?;
        for tun in t {
            for b in &tun.backends {
                let addr = b.address.to_string();
                for state in ["up", "down", "drained"] {
                    ConstGauge::new(i64::from(b.state == state)).encode(m.encode_family(&[
                        ("tunnel", tun.name.as_str()),
                        ("backend", addr.as_str()),
                        ("state", state),
                    ])?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_tunnel_backends_up",
            "Backends in each tunnel's table; 0: its packets are dropped or passed, as its no_backend says.",
            None,
            MetricType::Gauge,
        )?;
        for tun in t {
            let up = tun.backends.iter().filter(|b| b.state == "up").count();
            ConstGauge::new(clamp(up as u64)).encode(m.encode_family(&[("tunnel", tun.name.as_str())])?)?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_forward_tunnel_unforwarded",
            "Packets to a tunnel not forwarded by the driver, by outcome (unroutable: the next hop unresolved, forwarding off or no route).",
            None,
            MetricType::Counter,
        )?;
        for (i, name) in OUTCOMES.iter().enumerate() {
            let n = self.0.outcomes.get(i).copied().unwrap_or(0);
            ConstCounter::new(n).encode(m.encode_family(&[("outcome", *name)])?)?;
        }
        Ok(())
    }
}
