//! The fleet sync's series (only while it runs).

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::FleetStatus;
use crate::series::{Series, clamp, counter, gauge};

impl Series for FleetStatus {
    /// The fleet sync's series (only when it runs).
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let f = self;
        let i = clamp;
        gauge(enc, "limiter_fleet_store_up", "1 while the fleet's store answers syncs.", i64::from(f.store_up))?;
        gauge(
            enc,
            "limiter_fleet_nodes_seen",
            "Nodes with a recent heartbeat in the store.",
            i(f.nodes_seen.len() as u64),
        )?;
        gauge(enc, "limiter_fleet_pending_prefixes", "Prefixes with counts not yet pushed.", i(f.pending as u64))?;
        gauge(
            enc,
            "limiter_fleet_nodes_skewed",
            "Fleet nodes (this one included) whose clock is more than one slice of the finest fleet class off the store's.",
            i(f.skewed.len() as u64),
        )?;
        #[expect(clippy::cast_precision_loss, reason = "milliseconds of a clock offset")]
        let offset = f.clock_offset_ms as f64 / 1e3;
        let m = enc.encode_descriptor(
            "limiter_fleet_clock_offset_seconds",
            "This node's wall clock minus the store's (measured at each sync, to half its round trip).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(offset).encode(m)?;
        counter(enc, "limiter_fleet_syncs", "Successful syncs with the store.", f.syncs)?;
        counter(enc, "limiter_fleet_outages", "Times the store became unreachable.", f.outages)?;
        counter(enc, "limiter_fleet_prefixes_pushed", "Prefix pushes to the store.", f.prefixes_pushed_total)?;
        counter(enc, "limiter_fleet_store_commands", "Commands sent to the store.", f.commands_total)?;
        let mut m = enc.encode_descriptor(
            "limiter_fleet_sync_errors",
            "Failed syncs by kind: timeout, connection, server, auth (NOAUTH or WRONGPASS).",
            None,
            MetricType::Counter,
        )?;
        for (k, n) in f.errors.iter() {
            ConstCounter::new(n).encode(m.encode_family(&[("kind", k.label())])?)?;
        }
        let now_ms = crate::clock::unix_millis();
        #[expect(clippy::cast_precision_loss, reason = "seconds of an outage")]
        let current = f.down_since_unix_ms.map_or(0.0, |t| now_ms.saturating_sub(t) as f64 / 1e3);
        let m = enc.encode_descriptor(
            "limiter_fleet_outage_seconds",
            "Seconds the store has been unreachable, the current outage included.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(f.outage_secs_total + current).encode(m)?;
        let m = enc.encode_descriptor(
            "limiter_fleet_sync_seconds",
            "Time spent in successful syncs (divide by limiter_fleet_syncs_total for the mean).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(f.latency_sum_secs).encode(m)?;
        let mut m = enc.encode_descriptor(
            "limiter_fleet_sync_latency_seconds",
            "Latency of the last sync and the longest since start.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(f.last_latency_ms / 1e3).encode(m.encode_family(&[("stat", "last")])?)?;
        ConstGauge::new(f.max_latency_ms / 1e3).encode(m.encode_family(&[("stat", "max")])?)?;
        Ok(())
    }
}
