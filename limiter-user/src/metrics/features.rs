//! The series of the daemon's features: the fleet sync, the forwarders,
//! the feedback governor and escalation, SYN cookies.

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{FeedbackCounts, SnapshotCollector};

impl SnapshotCollector {
    /// The fleet sync's series (only when it runs).
    pub(super) fn fleet(enc: &mut DescriptorEncoder, f: &crate::fleet::FleetStatus) -> std::fmt::Result {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (gauge, counter) = (Self::gauge, Self::counter);
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
        let now_ms = u64::try_from(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis()),
        )
        .unwrap_or(0);
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

    /// Per forwarder (labels bounded by the policy: forwarder names and
    /// upstream addresses it declares).
    pub(super) fn forwards(enc: &mut DescriptorEncoder, forwards: &[crate::control::ForwardInfo]) -> std::fmt::Result {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
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
                ("forwarded", f.completed.saturating_sub(f.upstream_failed)),
                ("shed", shed),
                ("upstream_failed", f.upstream_failed),
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
            for (addr, up) in &f.upstreams {
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
        Ok(())
    }

    /// The feedback governor's decisions, escalations and proofs.
    pub(super) fn feedback(enc: &mut DescriptorEncoder, f: &FeedbackCounts) -> std::fmt::Result {
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
        let m = enc.encode_descriptor(
            "limiter_escalations",
            "Prefixes the daemon's automatic escalation asked to deny (then governed like any penalty).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(f.escalations).encode(m)?;
        let m = enc.encode_descriptor(
            "limiter_escalations_unproven",
            "Prefix-seconds above the escalation rate whose drops came from addresses that never proved themselves (a verified SYN cookie or a TCP handshake the kernel accepted): dropped, not escalated.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(f.unproven).encode(m)?;
        let m = enc.encode_descriptor(
            "limiter_proven_sources",
            "Source addresses proven now (a verified SYN cookie or a TCP handshake the kernel accepted in the last 10 minutes); only their drops count toward escalation.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(f.proven_sources).unwrap_or(i64::MAX)).encode(m)?;
        Ok(())
    }

    pub(super) fn syn_cookies(
        enc: &mut DescriptorEncoder,
        classes: &[crate::control::SynCookieRow],
        refused: bool,
    ) -> std::fmt::Result {
        if classes.is_empty() {
            return Ok(());
        }
        Self::gauge(
            enc,
            "limiter_syn_cookies_refused",
            "1 while the kernel answers the cookie ACKs XDP verified with RST (it took none of them in the last 5 s: no route back to the SYNs' sources, most likely).",
            i64::from(refused),
        )?;
        let mut m = enc.encode_descriptor(
            "limiter_syn_cookies_engaged",
            "1 while a class answers SYNs from sources without a bucket with SYN cookies.",
            None,
            MetricType::Gauge,
        )?;
        for c in classes {
            let mode = crate::policy::spelling(&c.mode);
            ConstGauge::new(i64::from(c.engaged))
                .encode(m.encode_family(&[("class", c.class.as_str()), ("mode", mode.as_str())])?)?;
        }
        Ok(())
    }
}
