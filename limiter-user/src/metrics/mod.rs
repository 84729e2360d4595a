//! Prometheus metrics, collected at scrape time: each scrape asks the
//! daemon for a snapshot of the kernel's counters and its features'
//! reports, and encodes it with prometheus-client: the data plane's series
//! here, then each feature's own ([`Series`]). No label carries an address
//! or a prefix, so the number of series is fixed by reasons, families,
//! classes and what the policy declares.

mod http;

use limiter_common::{Action, ClassCounters, Reason, family};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

pub use self::http::{HEADER_TIMEOUT, MAX_CONNS, ScrapeCall, serve};
use crate::{
    dataplane::Totals,
    series::{Series, clamp, counter, gauge},
};

/// Default listen address of `/metrics`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// What one scrape reports.
#[derive(Debug, Default)]
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
    /// The reports of the daemon's features, each encoding its series.
    pub features: Vec<Box<dyn Series>>,
    /// Classes with SYN cookies: name, mode (`auto`, `always`) and whether
    /// the data plane answers SYNs with cookies now.
    pub syn_cookies: Vec<crate::control::SynCookieRow>,
    pub tcp_state: Vec<crate::control::TcpStateRow>,
    /// The program runs without SYN cookies (the kernel lacks their
    /// helpers).
    pub without_syn_cookies: bool,
    /// Policy file reloads (SIGHUP, `policy apply`) by result.
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// The operator's requests the daemon refused, by verb (every verb,
    /// zero too).
    pub control_refused: Vec<(&'static str, u64)>,
    pub last_reload_ok: Option<u64>,
    pub last_reload_failed: Option<u64>,
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

    /// Each TCP guard's classes: SYN cookies, the out-of-state check.
    fn tcp_guards(enc: &mut DescriptorEncoder, s: &Snapshot) -> std::fmt::Result {
        Self::engaged(
            enc,
            (
                "limiter_syn_cookies_engaged",
                "1 while a class answers SYNs from sources without a bucket with SYN cookies.",
            ),
            s.syn_cookies.iter().map(|c| (c.class.as_str(), crate::policy::spelling(&c.mode), c.engaged)),
        )?;
        Self::engaged(
            enc,
            (
                "limiter_tcp_state_engaged",
                "1 while a class drops TCP segments no connection of this host holds (always, or auto engaged).",
            ),
            s.tcp_state.iter().map(|c| (c.class.as_str(), crate::policy::spelling(&c.mode), c.engaged)),
        )?;
        Ok(())
    }

    /// A gauge per class of a TCP guard (SYN cookies, the out-of-state
    /// check): 1 while it acts, labelled with the class and its mode;
    /// nothing when no class has it.
    fn engaged<'a>(
        enc: &mut DescriptorEncoder,
        (name, help): (&str, &str),
        classes: impl ExactSizeIterator<Item = (&'a str, String, bool)>,
    ) -> std::fmt::Result {
        if classes.len() == 0 {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (class, mode, engaged) in classes {
            ConstGauge::new(i64::from(engaged))
                .encode(m.encode_family(&[("class", class), ("mode", mode.as_str())])?)?;
        }
        Ok(())
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let i = clamp;
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
        gauge(
            &mut enc,
            "limiter_tracked_prefixes",
            "Prefixes with a bucket (refreshed in the background).",
            i(s.tracked as u64),
        )?;
        gauge(&mut enc, "limiter_tracked_prefixes_capacity", "Capacity of the bucket map.", i64::from(s.capacity))?;
        gauge(
            &mut enc,
            "limiter_policy_version",
            "Version of the policy the data plane enforces.",
            i(s.policy_version),
        )?;
        let mut m = enc.encode_descriptor(
            "limiter_policy_reloads",
            "Policy file reloads (SIGHUP, policy apply) by result.",
            None,
            MetricType::Counter,
        )?;
        for (result, n) in [("success", s.reloads_ok), ("failure", s.reloads_failed)] {
            ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
        }
        crate::series::counters(
            &mut enc,
            "limiter_control_refused",
            "The operator's requests the daemon refused (nothing changed), by verb; no reload.",
            "verb",
            s.control_refused.iter().copied(),
        )?;
        for (name, help, t) in [
            (
                "limiter_policy_last_success_timestamp_seconds",
                "Unix time of the last policy file applied.",
                s.last_reload_ok,
            ),
            (
                "limiter_policy_last_failure_timestamp_seconds",
                "Unix time of the last policy file rejected.",
                s.last_reload_failed,
            ),
        ] {
            gauge(&mut enc, name, help, i(t.unwrap_or(0)))?;
        }
        let mut m = enc.encode_descriptor(
            "limiter_attached",
            "1 while the program is attached to the interface in this mode.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(s.attached))
            .encode(m.encode_family(&[("interface", s.iface.as_str()), ("mode", s.attach_mode.as_str())])?)?;
        counter(
            &mut enc,
            "limiter_reattaches",
            "Times the daemon found its XDP link or pin gone and put it back.",
            s.reattaches,
        )?;
        Self::tcp_guards(&mut enc, s)?;
        gauge(
            &mut enc,
            "limiter_kernel_lacks_syn_cookies",
            "1 while the program runs without SYN cookies: the kernel lacks their helpers (see `limiter status`).",
            i64::from(s.without_syn_cookies),
        )?;
        for f in &s.features {
            f.encode(&mut enc)?;
        }
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
            backends: vec![("127.0.0.1:8443".into(), true)],
            bytes_up: 5,
            ..Default::default()
        };
        let features: Vec<Box<dyn Series>> = vec![Box::new(crate::forward::Reports(vec![f]))];
        let text = render(Snapshot { features, ..Snapshot::default() });
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

    /// docs/operations.md has one table of every series: each family a
    /// daemon with every feature running exposes is in it.
    #[test]
    fn the_operators_table_names_every_series() {
        let features: Vec<Box<dyn Series>> = vec![
            Box::new(crate::forward::Reports(vec![crate::control::ForwardInfo {
                name: "f".into(),
                shed: vec![("max_connections".into(), 1)],
                backends: vec![("127.0.0.1:1".into(), true)],
                ..Default::default()
            }])),
            Box::new(crate::fleet::FleetStatus::default()),
            Box::new(crate::feedback::FeedbackCounts::default()),
            Box::new(crate::feedback::EscalationCounts::default()),
            Box::new(crate::engine::enforcer::deny::series::DenyReport { origins: vec![("feed:f".into(), 1, 1)] }),
            Box::new(crate::feeds::FeedReports(vec![crate::feeds::FeedReport {
                name: "f".into(),
                ..Default::default()
            }])),
            Box::new(crate::crowdsec::Report::default()),
            Box::new(crate::cookies::feature::Refused(true)),
        ];
        let syn_cookies = vec![SynCookieRow { class: "c".into(), mode: SynCookies::Auto, engaged: true }];
        let mut s = Snapshot { features, syn_cookies, ..Snapshot::default() };
        s.classes.push(("default".into(), ClassCounters::default()));
        let text = render(s);
        let doc = include_str!("../../../docs/operations.md");
        let table: Vec<&str> = doc.lines().filter(|l| l.trim_start().starts_with("| `limiter_")).collect();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        for feature in [
            "limiter_forward_",
            "limiter_fleet_",
            "limiter_feedback_",
            "limiter_syn_cookies_",
            "limiter_deny_",
            "limiter_feed_",
        ] {
            assert!(families.iter().any(|f| f.starts_with(feature)), "no {feature} series in\n{text}");
        }
        for f in families {
            let named = |n: &str| table.iter().any(|row| row.contains(&format!("`{n}`")));
            assert!(named(f) || named(&format!("{f}_total")), "{f} is not in the metrics table of docs/operations.md");
        }
    }

    #[test]
    fn names_follow_prometheus_conventions_and_carry_no_addresses() {
        let feedback: Box<dyn Series> = Box::new(crate::feedback::FeedbackCounts::default());
        let escalation: Box<dyn Series> = Box::new(crate::feedback::EscalationCounts::default());
        let mut s = Snapshot {
            iface: "eth0".into(),
            attach_mode: "native".into(),
            features: vec![feedback, escalation],
            ..Snapshot::default()
        };
        s.totals.add(Reason::RateLimited, family::IPV4, limiter_common::Counter { packets: 7, bytes: 0 });
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
        // escalations, unproven, capped, proven sources; kernel lacks SYN
        // cookies; build_info.
        let reasons = limiter_common::REASON_COUNT;
        assert_eq!(series, 2 * reasons * 3 + 3 + 3 + 2 + 2 + 1 + 1 + 7 + 4 + 1 + 1, "series count is fixed");
    }
}
