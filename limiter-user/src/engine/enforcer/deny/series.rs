//! The deny set's series, by origin: what it holds and what it dropped.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::series::{Series, clamp};

/// What the deny set holds and drops, by origin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DenyReport {
    /// Origin (`feed:NAME`, ...), networks it denies, packets the data
    /// plane dropped for it.
    pub origins: Vec<(String, usize, u64)>,
}

impl Series for DenyReport {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            "limiter_deny_networks",
            "Networks the deny set holds, by origin (feed:NAME, ...); a network several origins deny counts under each.",
            None,
            MetricType::Gauge,
        )?;
        for (origin, n, _) in &self.origins {
            ConstGauge::new(clamp(*n as u64)).encode(m.encode_family(&[("origin", origin.as_str())])?)?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_deny_dropped_packets",
            "Packets the deny set dropped, by origin (the lowest-numbered of the origins that deny the network).",
            None,
            MetricType::Counter,
        )?;
        for (origin, _, drops) in &self.origins {
            ConstCounter::new(*drops).encode(m.encode_family(&[("origin", origin.as_str())])?)?;
        }
        Ok(())
    }
}
