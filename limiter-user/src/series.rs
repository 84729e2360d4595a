//! What a room shows Prometheus: each feature's report encodes its own
//! series through [`Series`] (`fleet`, `forward`, `feedback`); `metrics`
//! writes the data plane's and then every feature's, at scrape time, off
//! the daemon's loop. No label carries an address or a prefix.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// A report that writes its own series.
pub trait Series: std::fmt::Debug + Send + Sync {
    /// Write every series of this report.
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result;
}

/// One gauge without labels.
pub fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// One counter without labels.
pub fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A gauge family with one label: a sample per `(label value, value)`.
pub fn gauges<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, i64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, v) in samples {
        ConstGauge::new(v).encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// A counter family with one label: a sample per `(label value, count)`.
pub fn counters<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in samples {
        ConstCounter::new(n).encode(m.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// A count as a gauge's value (saturating).
#[must_use]
pub fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
