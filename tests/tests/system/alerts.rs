//! The shipped alert rules (`packaging/prometheus/limiter-alerts.yml`)
//! loaded by Prometheus's own rule checker and evaluator, Debian's
//! `promtool` (extracted by `cargo xtask setup` from the `prometheus`
//! package, which is not installed): they parse, and each alert fires on
//! the series that should raise it, after its `for`, and not before.
//! (`metrics.rs` checks that every metric they name is exposed.)

use std::{path::PathBuf, process::Command};

use limiter_tests::kernel::TempDir;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn promtool() -> PathBuf {
    let p = workspace().join("target/tools/prometheus/usr/bin/promtool");
    assert!(p.exists(), "{} is missing: run `cargo xtask setup`", p.display());
    p
}

fn rules() -> PathBuf {
    workspace().join("packaging/prometheus/limiter-alerts.yml").canonicalize().unwrap()
}

#[test]
fn prometheus_loads_the_alert_rules() {
    let _alone = limiter_tests::alone(module_path!());
    let o = Command::new(promtool()).args(["check", "rules"]).arg(rules()).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("SUCCESS: 10 rules found"), "{out}");
}

/// Synthetic series, a scrape a minute, through `promtool test rules`:
/// each alert fires where it should and not earlier.
#[test]
#[expect(clippy::too_many_lines, reason = "one promtool unit: each alert's series beside what it must raise")]
fn each_alert_fires_on_what_should_raise_it() {
    let _alone = limiter_tests::alone(module_path!());
    let tmp = TempDir::new("alerts");
    let unit = tmp.0.join("limiter-alerts.test.yml");
    let text = format!(
        r#"rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Attached for 3 minutes, then detached (the daemon still scraped).
      - series: 'limiter_attached{{instance="edge1", interface="eth0", mode="native"}}'
        values: '1 1 1 0 0 0 0 0'
      # 2,000 drops a second from minute 0 on.
      - series: 'limiter_packets_total{{instance="edge2", action="drop", reason="rate_limited", family="ipv4"}}'
        values: '0+120000x20'
      - series: 'limiter_attached{{instance="edge2", interface="eth0", mode="native"}}'
        values: '1x20'
      # One policy refused at minute 2.
      - series: 'limiter_policy_reloads_total{{instance="edge2", result="failure"}}'
        values: '0 0 1 1 1 1'
      # The bucket map 95% full throughout.
      - series: 'limiter_tracked_prefixes{{instance="edge2"}}'
        values: '950x20'
      - series: 'limiter_tracked_prefixes_capacity{{instance="edge2"}}'
        values: '1000x20'
      # A group's file 44 days old, aging a day a minute (over 45 days from
      # minute 2); another never read.
      - series: 'limiter_group_file_age_seconds{{instance="edge2", group="de"}}'
        values: '3801600+86400x60'
      - series: 'limiter_group_file_age_seconds{{instance="edge3", group="fr"}}'
        values: '-1x60'
      # An escalation refused at its cap at minute 5.
      - series: 'limiter_escalations_capped_total{{instance="edge5"}}'
        values: '0 0 0 0 0 1 1 1'
      # An attack going on from minute 2 to minute 4.
      - series: 'limiter_attack_active{{instance="edge6"}}'
        values: '0 0 1 1 1 0 0 0'
      # The BGP session up for 3 minutes, then down; the speaker always up.
      - series: 'limiter_upstream_session_up{{instance="edge4", neighbor="192.0.2.1"}}'
        values: '1 1 1 0 0 0 0 0'
      - series: 'limiter_upstream_speaker_up{{instance="edge4"}}'
        values: '1x20'
      # Rules: 40 from minute 0, 100 (the cap) from minute 3.
      - series: 'limiter_upstream_rules{{instance="edge4", trigger="operator"}}'
        values: '40 40 40 60x20'
      - series: 'limiter_upstream_rules{{instance="edge4", trigger="pressure"}}'
        values: '0 0 0 40x20'
      - series: 'limiter_upstream_max_rules{{instance="edge4"}}'
        values: '100x20'
      # A tunnel with 2 backends up, none from minute 3.
      - series: 'limiter_forward_tunnel_backends_up{{instance="edge7", tunnel="web"}}'
        values: '2 2 2 0x20'
    alert_rule_test:
      - eval_time: 4m
        alertname: LimiterNotAttached
        exp_alerts: []
      - eval_time: 6m
        alertname: LimiterNotAttached
        exp_alerts:
          - exp_labels: {{ severity: critical, instance: edge1, interface: eth0, mode: native }}
            exp_annotations:
              summary: "limiter is not attached (or its daemon is not scraped)"
              description: "Without --pin nothing enforces while the daemon is down."
      - eval_time: 4m
        alertname: LimiterDropping
        exp_alerts: []
      - eval_time: 11m
        alertname: LimiterDropping
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge2 }}
            exp_annotations:
              summary: "limiter on edge2 drops 2k packets/s"
              description: "A flood is being held back, or a policy is too tight. See `limiter stats`."
      - eval_time: 1m
        alertname: LimiterReloadFailed
        exp_alerts: []
      - eval_time: 3m
        alertname: LimiterReloadFailed
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge2, result: failure }}
            exp_annotations:
              summary: "limiter on edge2 rejected its policy file (SIGHUP or policy apply)"
              description: "The previous policy keeps running. `limiter status` shows the error."
      - eval_time: 5m
        alertname: LimiterBucketMapNearlyFull
        exp_alerts: []
      - eval_time: 12m
        alertname: LimiterBucketMapNearlyFull
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge2 }}
            exp_annotations:
              summary: "limiter on edge2: bucket map 95% full"
              description: "Evictions hand returning prefixes a fresh bucket. Raise capacity or coarsen prefixes."
      - eval_time: 4m
        alertname: LimiterUpstreamSessionDown
        exp_alerts: []
      - eval_time: 6m
        alertname: LimiterUpstreamSessionDown
        exp_alerts:
          - exp_labels: {{ severity: critical, instance: edge4, neighbor: 192.0.2.1 }}
            exp_annotations:
              summary: "limiter on edge4: the BGP speaker or a session of it is down"
              description: "Rules wanted upstream do not reach the transit (the host's own dropping goes on). See `limiter upstream list` and the speaker's log."
      - eval_time: 7m
        alertname: LimiterUpstreamRulesAtCap
        exp_alerts: []
      - eval_time: 9m
        alertname: LimiterUpstreamRulesAtCap
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge4 }}
            exp_annotations:
              summary: "limiter on edge4: upstream rules at upstream.max_rules"
              description: "Further rules are refused (the operator's) or left out (automation's): see limiter_upstream_refused_total and `limiter upstream list`."
      - eval_time: 3m
        alertname: LimiterEscalationCapped
        exp_alerts: []
      - eval_time: 6m
        alertname: LimiterEscalationCapped
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge5 }}
            exp_annotations:
              summary: "limiter on edge5: an escalation was refused at its cap"
              description: "A proven source dropped above the escalation rate was not denied: feedback.escalate.max_denied is full, or escalations without drops of held connections fill their half of it (spoofed victims?). See `limiter prefix list` and the daemon's log."
      - eval_time: 1m
        alertname: LimiterUnderAttack
        exp_alerts: []
      - eval_time: 3m
        alertname: LimiterUnderAttack
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge6 }}
            exp_annotations:
              summary: "limiter on edge6: an attack is going on"
              description: "It refuses more than [attacks]' thresholds, sustained. `limiter attacks` shows its record so far: sources, reasons, what the guard did."
      - eval_time: 6m
        alertname: LimiterUnderAttack
        exp_alerts: []
      - eval_time: 3m
        alertname: LimiterTunnelNoBackend
        exp_alerts: []
      - eval_time: 5m
        alertname: LimiterTunnelNoBackend
        exp_alerts:
          - exp_labels: {{ severity: critical, instance: edge7, tunnel: web }}
            exp_annotations:
              summary: "limiter on edge7: tunnel web has no backend up"
              description: "Its packets are dropped, or passed to this host's stack, as its no_backend says. See `limiter backend list`: each backend's state and its last check's error."
      - eval_time: 25m
        alertname: LimiterGroupFileStale
        exp_alerts: []
      - eval_time: 45m
        alertname: LimiterGroupFileStale
        exp_alerts:
          - exp_labels: {{ severity: warning, instance: edge3, group: fr }}
            exp_annotations:
              summary: "limiter on edge3: group fr's file is stale or unread"
              description: "Over 45 days old (a monthly list missed its update), or never read (-1): the group holds the networks of its last version. See `limiter status` and the daemon's log."
          - exp_labels: {{ severity: warning, instance: edge2, group: de }}
            exp_annotations:
              summary: "limiter on edge2: group de's file is stale or unread"
              description: "Over 45 days old (a monthly list missed its update), or never read (-1): the group holds the networks of its last version. See `limiter status` and the daemon's log."
"#,
        rules = rules().display()
    );
    std::fs::write(&unit, text).unwrap();
    let o = Command::new(promtool()).args(["test", "rules"]).arg(&unit).output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}
