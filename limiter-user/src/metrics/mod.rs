//! Prometheus metrics, collected at scrape time: each scrape asks the
//! daemon for a snapshot of the kernel's counters and encodes it with
//! prometheus-client. No label carries an address or a prefix, so the
//! number of series is fixed by reasons, families and classes.

mod features;
mod http;

use limiter_common::{Action, ClassCounters, Reason, family};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

pub use self::http::{HEADER_TIMEOUT, MAX_CONNS, ScrapeCall, serve};
use crate::dataplane::Totals;

/// Default listen address of `/metrics`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// What one scrape reports.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub totals: Totals,
    /// Class name and its counters, in class order.
    pub classes: Vec<(String, ClassCounters)>,
    pub policy_version: u64,
    pub capacity: u32,
    pub tracked: usize,
    pub iface: String,
    pub attach_mode: String,
    /// The program is on the interface (checked every second).
    pub attached: bool,
    /// Times a lost link or pin was put back.
    pub reattaches: u64,
    pub forwards: Vec<crate::control::ForwardInfo>,
    /// Feedback decisions and escalations.
    pub feedback: FeedbackCounts,
    /// The fleet sync, if the daemon runs one.
    pub fleet: Option<crate::fleet::FleetStatus>,
    /// Classes with SYN cookies: name, mode (`auto`, `always`) and whether
    /// the data plane answers SYNs with cookies now.
    pub syn_cookies: Vec<crate::control::SynCookieRow>,
    /// The kernel answers the cookie ACKs XDP verified with RST (see the
    /// daemon's `cookie_watch`).
    pub syn_cookies_refused: bool,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub last_reload_ok: Option<u64>,
    pub last_reload_failed: Option<u64>,
}

/// What the feedback governor decided since the daemon started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedbackCounts {
    pub applied: u64,
    pub shadowed: u64,
    /// Refusals of the governor, by why.
    pub refused: crate::policy::feedback::Refusals,
    /// Escalations the daemon decided (then governed like any penalty).
    pub escalations: u64,
    /// Prefix-seconds above the escalation rate whose drops came from
    /// addresses that never proved themselves: dropped, not escalated.
    pub unproven: u64,
    /// Addresses proven now (a verified SYN cookie or a TCP connection
    /// the kernel accepted, within the last 10 minutes).
    pub proven_sources: u64,
}

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

impl SnapshotCollector {
    fn counters(&self, enc: &mut DescriptorEncoder, name: &str, help: &str, bytes: bool) -> std::fmt::Result {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for r in Reason::ALL {
            for fam in family::ALL {
                let c = self.0.totals.of_family(r, fam);
                let labels = [("action", r.action().label()), ("reason", r.label()), ("family", family::label(fam))];
                ConstCounter::new(if bytes { c.bytes } else { c.packets }).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    pub(super) fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
        ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
    }

    pub(super) fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
        ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.counters(&mut enc, "limiter_packets", "Packets by action, reason and address family.", false)?;
        self.counters(&mut enc, "limiter_bytes", "Bytes (whole frames) by action, reason and address family.", true)?;
        let mut m = enc.encode_descriptor(
            "limiter_class_packets",
            "Packets per rule class and action.",
            None,
            MetricType::Counter,
        )?;
        for (name, c) in &s.classes {
            for a in Action::ALL {
                let labels = [("class", name.as_str()), ("action", a.label())];
                ConstCounter::new(c.get(a).packets).encode(m.encode_family(&labels)?)?;
            }
        }
        Self::gauge(
            &mut enc,
            "limiter_tracked_prefixes",
            "Prefixes with a bucket (refreshed in the background).",
            i(s.tracked as u64),
        )?;
        Self::gauge(
            &mut enc,
            "limiter_tracked_prefixes_capacity",
            "Capacity of the bucket map.",
            i64::from(s.capacity),
        )?;
        Self::gauge(
            &mut enc,
            "limiter_policy_version",
            "Version of the policy the data plane enforces.",
            i(s.policy_version),
        )?;
        let mut m =
            enc.encode_descriptor("limiter_policy_reloads", "Policy applies by result.", None, MetricType::Counter)?;
        for (result, n) in [("success", s.reloads_ok), ("failure", s.reloads_failed)] {
            ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
        }
        for (name, help, t) in [
            (
                "limiter_policy_last_success_timestamp_seconds",
                "Unix time of the last applied policy.",
                s.last_reload_ok,
            ),
            (
                "limiter_policy_last_failure_timestamp_seconds",
                "Unix time of the last rejected policy.",
                s.last_reload_failed,
            ),
        ] {
            Self::gauge(&mut enc, name, help, i(t.unwrap_or(0)))?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_attached",
            "1 while the program is attached to the interface in this mode.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(s.attached))
            .encode(m.encode_family(&[("interface", s.iface.as_str()), ("mode", s.attach_mode.as_str())])?)?;
        Self::counter(
            &mut enc,
            "limiter_reattaches",
            "Times the daemon found its XDP link or pin gone and put it back.",
            s.reattaches,
        )?;
        Self::syn_cookies(&mut enc, &s.syn_cookies, s.syn_cookies_refused)?;
        Self::forwards(&mut enc, &s.forwards)?;
        if let Some(f) = &s.fleet {
            Self::fleet(&mut enc, f)?;
        }
        Self::feedback(&mut enc, &s.feedback)?;
        let mut m = enc.encode_descriptor("limiter_build_info", "Build information.", None, MetricType::Gauge)?;
        let labels = [("version", crate::VERSION), ("revision", crate::GIT_REVISION)];
        ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        Ok(())
    }
}

/// Encode one snapshot in the Prometheus text format.
#[must_use]
pub fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snapshot)));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{control::SynCookieRow, policy::SynCookies};

    #[test]
    fn syn_cookie_classes_have_an_engaged_gauge_each() {
        let s = Snapshot {
            syn_cookies: vec![
                SynCookieRow { class: "app-syn".into(), mode: SynCookies::Auto, engaged: true },
                SynCookieRow { class: "api".into(), mode: SynCookies::Always, engaged: false },
            ],
            ..Snapshot::default()
        };
        let text = render(s);
        assert!(text.contains(r#"limiter_syn_cookies_engaged{class="app-syn",mode="auto"} 1"#), "{text}");
        assert!(text.contains(r#"limiter_syn_cookies_engaged{class="api",mode="always"} 0"#), "{text}");
        assert!(!render(Snapshot::default()).contains("limiter_syn_cookies"));
    }

    #[test]
    fn each_forwarder_has_its_series_labelled_by_name() {
        let f = crate::control::ForwardInfo {
            name: "https".into(),
            active: 3,
            shed: vec![("max_connections".into(), 9)],
            upstreams: vec![("127.0.0.1:8443".into(), true)],
            bytes_up: 5,
            ..Default::default()
        };
        let text = render(Snapshot { forwards: vec![f], ..Snapshot::default() });
        for line in [
            r#"limiter_forward_connections_active{listener="https"} 3"#,
            r#"limiter_forward_shed_total{listener="https",reason="max_connections"} 9"#,
            r#"limiter_forward_connections_total{listener="https",outcome="shed"} 9"#,
            r#"limiter_forward_upstream_up{listener="https",upstream="127.0.0.1:8443"} 1"#,
            r#"limiter_forward_bytes_total{listener="https",direction="to_upstream"} 5"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn names_follow_prometheus_conventions_and_carry_no_addresses() {
        let mut s = Snapshot { iface: "eth0".into(), attach_mode: "native".into(), ..Snapshot::default() };
        s.totals.by_family[Reason::RateLimited as usize][1].packets = 7;
        s.classes.push(("default".into(), ClassCounters::default()));
        let text = render(s);
        assert!(
            text.contains(r#"limiter_packets_total{action="drop",reason="rate_limited",family="ipv4"} 7"#),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(name.starts_with("limiter_"), "{line}");
            assert!(!line.contains("198.") && !line.contains('/'), "{line}");
        }
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        // packets and bytes: every reason x 3 families each; one class x 3
        // actions; tracked, capacity, version; reloads x 2 results; two
        // reload timestamps; attached; reattaches; 7 feedback results;
        // escalations, unproven, proven sources; build_info.
        let reasons = limiter_common::REASON_COUNT;
        assert_eq!(series, 2 * reasons * 3 + 3 + 3 + 2 + 2 + 1 + 1 + 7 + 3 + 1, "series count is fixed");
    }
}
