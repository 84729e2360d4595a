//! The groups' series: each group's networks and file, and what the data
//! plane passed and dropped for it.

use std::time::SystemTime;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::series::{Series, clamp};

/// How each group reads, by index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupReports(pub Vec<GroupReport>);

/// One group's file and networks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupReport {
    pub name: String,
    /// Networks of the version in force (in the data plane).
    pub networks: u64,
    /// Networks of the last version read (in force once applied).
    pub read_networks: u64,
    /// Networks of the last version finer than a bucket prefix, left out.
    pub left_out: u64,
    pub reads: u64,
    pub read_errors: u64,
    pub refused: u64,
    /// Unix time its last version was applied (0: none yet).
    pub applied_at: u64,
    /// When the file of its last version was written.
    pub modified: Option<SystemTime>,
    pub shadow: bool,
}

/// What the data plane passed and dropped for each group, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHitsReport(pub Vec<(String, u64, u64)>);

impl Series for GroupReports {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        type Gauge<'a> = (&'a str, &'a str, fn(&GroupReport) -> i64);
        let gauges: [Gauge; 3] = [
            ("limiter_group_networks", "Networks of each group in the data plane.", |g| clamp(g.networks)),
            (
                "limiter_group_left_out_networks",
                "Networks of each group's last version finer than a bucket prefix, left out (a bucket prefix is in a group only when the group holds all of it).",
                |g| clamp(g.left_out),
            ),
            (
                "limiter_group_file_age_seconds",
                "Seconds since each group's file (its last version read) was written; -1: none read yet.",
                |g| g.modified.map_or(-1, |m| clamp(SystemTime::now().duration_since(m).map_or(0, |d| d.as_secs()))),
            ),
        ];
        for (name, help, v) in gauges {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for g in &self.0 {
                ConstGauge::new(v(g)).encode(m.encode_family(&[("group", g.name.as_str())])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "limiter_group_versions",
            "Versions of each group's file by result: applied, read_error (the file or its format; the last version stays), refused.",
            None,
            MetricType::Counter,
        )?;
        for g in &self.0 {
            let applied = g.reads.saturating_sub(g.refused);
            for (result, n) in [("applied", applied), ("read_error", g.read_errors), ("refused", g.refused)] {
                ConstCounter::new(n).encode(m.encode_family(&[("group", g.name.as_str()), ("result", result)])?)?;
            }
        }
        Ok(())
    }
}

impl Series for GroupHitsReport {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(
            "limiter_group_packets",
            "Packets of each group's addresses by action: pass (admitted by the group's budget, or allowed), drop (over its budget, or denied; in shadow mode: would have been).",
            None,
            MetricType::Counter,
        )?;
        for (name, passed, dropped) in &self.0 {
            for (action, n) in [("pass", *passed), ("drop", *dropped)] {
                ConstCounter::new(n).encode(m.encode_family(&[("group", name.as_str()), ("action", action)])?)?;
            }
        }
        Ok(())
    }
}
