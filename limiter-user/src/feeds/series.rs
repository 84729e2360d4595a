//! Each feed's reads, as series.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::series::{Series, clamp};

/// How each feed reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedReports(pub Vec<FeedReport>);

/// One feed's reads and versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedReport {
    pub name: String,
    /// Versions read and handed to the policy state.
    pub reads: u64,
    /// Reads that failed (the file, its format): the last version stays.
    pub read_errors: u64,
    /// Versions the policy state refused (cap, shrink).
    pub refused: u64,
    /// Unix time its last version was applied (0: none yet).
    pub applied_at: u64,
    pub shadow: bool,
}

impl Series for FeedReports {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            "limiter_feed_versions",
            "Versions of each feed by result: applied, read_error (the file or its format; the last version stays), refused (its cap, or it shrank too much).",
            None,
            MetricType::Counter,
        )?;
        for f in &self.0 {
            let applied = f.reads.saturating_sub(f.refused);
            for (result, n) in [("applied", applied), ("read_error", f.read_errors), ("refused", f.refused)] {
                ConstCounter::new(n).encode(m.encode_family(&[("feed", f.name.as_str()), ("result", result)])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_feed_applied_timestamp_seconds",
            "Unix time each feed's version in force was applied (0: none yet).",
            None,
            MetricType::Gauge,
        )?;
        for f in &self.0 {
            ConstGauge::new(clamp(f.applied_at)).encode(m.encode_family(&[("feed", f.name.as_str())])?)?;
        }
        Ok(())
    }
}
