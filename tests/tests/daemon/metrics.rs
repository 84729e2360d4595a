//! `/metrics` over HTTP, scraped from inside the daemon's namespace during
//! real traffic: the counters match the traffic sent, and a flood from
//! 100,000 spoofed sources does not add a single series.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{thread, time::Duration};

use limiter_tests::{
    kernel::require_root,
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{
        self, CONFORM_SRC, Delivered, FLOOD_SRC, Guard, PORT, metric, scrape, spawn_lines, unique_socket, wait_for,
    },
};

struct Daemon {
    _g: Guard,
    _log: std::sync::mpsc::Receiver<String>,
}

fn daemon(net: &VethPair, tag: &str, extra: &[&str]) -> Daemon {
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--socket"]).arg(unique_socket(tag)).args(extra);
    let (g, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "metrics on http://127.0.0.1:9464/metrics", Duration::from_secs(20), &mut log).unwrap();
    Daemon { _g: g, _log: rx }
}

fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count()
}

const RL4: &str = r#"limiter_packets_total{action="drop",reason="rate_limited",family="ipv4"}"#;
const AD4: &str = r#"limiter_packets_total{action="pass",reason="admitted",family="ipv4"}"#;

#[test]
fn scraped_counters_match_the_traffic_of_a_real_flood() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("mx");
    net.add_source(FLOOD_SRC);
    net.add_source(CONFORM_SRC);
    let _d = daemon(&net, "mx", &["--rate", "1000", "--burst", "200"]);
    let traffic = scenario::start_traffic(&net, env!("CARGO_BIN_EXE_netload").as_ref(), 0, 300, 2.0).unwrap();
    thread::sleep(Duration::from_secs(1));
    let mid = scrape(&net);
    assert!(metric(&mid, RL4) > 1000, "scrape during the flood sees drops: {}", metric(&mid, RL4));

    let Delivered { flood_sent, flood_got, conform_sent, conform_got, .. } = traffic.finish().unwrap();
    let text = scrape(&net);
    assert_eq!(conform_got, conform_sent, "conforming packets lost; links:\n{}", net.link_counters());
    println!("flood sent {flood_sent} got {flood_got}; {RL4} {}; {AD4} {}", metric(&text, RL4), metric(&text, AD4));

    // Tolerance: a busy veth ring may shed up to 1% of the flood before XDP
    // sees it, so drops are between 99% and 100% of what went missing.
    let missing = flood_sent - flood_got;
    let drops = metric(&text, RL4);
    assert!(drops <= missing && drops as f64 >= 0.99 * missing as f64, "drops {drops} vs missing {missing}");
    // Everything that arrived was admitted by XDP, and nothing else was
    // (the namespaces carry no other IPv4 traffic).
    assert_eq!(metric(&text, AD4), flood_got + conform_got);
    // The class counters span both families (the veth also carries IPv6
    // link-local chatter: router solicitations, MLD).
    let pass_default = metric(&text, r#"limiter_class_packets_total{class="default",action="pass"}"#);
    let ad6 = metric(&text, r#"limiter_packets_total{action="pass",reason="admitted",family="ipv6"}"#);
    assert_eq!(pass_default, flood_got + conform_got + ad6);
    assert_eq!(metric(&text, "limiter_policy_version"), 1);
    assert_eq!(metric(&text, r#"limiter_attached{interface="vb",mode="native"}"#), 1);
    // The build: the version and the revision `limiter --version` names.
    let version =
        std::process::Command::new(scenario::locate_bin("limiter").unwrap()).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    let (v, rev) = version.trim().strip_prefix("limiter ").unwrap().split_once(" (git ").unwrap();
    let info = format!(r#"limiter_build_info{{version="{v}",revision="{}"}}"#, rev.trim_end_matches(')'));
    assert_eq!(metric(&text, &info), 1, "{info} not in the scrape");
}

#[test]
fn one_hundred_thousand_spoofed_sources_add_no_series() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("sp");
    // /32 buckets: every spoofed source is a prefix of its own; no
    // new-source budget, so every one of them gets a bucket.
    let _d = daemon(&net, "sp", &["--v4-prefix", "32", "--rate", "100", "--burst", "10", "--new-source-rate", "0"]);
    let before = scrape(&net);
    let mac = net.b_mac();
    let o = net
        .a
        .command(env!("CARGO_BIN_EXE_netload"))
        .args(["spoof", "va", &mac, &format!("{B_ADDR}:{PORT}"), "100000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("sent 100000"));
    // The tracker refreshes every 2 s.
    let mut after = scrape(&net);
    for _ in 0..20 {
        if metric(&after, "limiter_tracked_prefixes") >= 100_000 {
            break;
        }
        thread::sleep(Duration::from_millis(500));
        after = scrape(&net);
    }
    let tracked = metric(&after, "limiter_tracked_prefixes");
    // The spoofed sources, and at most a few of the namespace's own IPv6
    // link-local chatter.
    assert!((100_000..=100_016).contains(&tracked), "tracked {tracked}");
    assert_eq!(series(&after), series(&before), "series grew with sources");
    assert!(!after.contains("198.18.") && !after.contains("2001:"), "an address leaked into a label");
    assert_eq!(metric(&after, "limiter_tracked_prefixes_capacity"), 262_144);
}

/// Metric names a query refers to: `limiter_...` identifiers.
fn metric_names(query: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = query;
    while let Some(i) = rest.find("limiter_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_dashboard_and_alert_query_names_an_exposed_metric() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("dq");
    // With `[upstream]` (its speaker not running: its series are there).
    let dir = limiter_tests::kernel::TempDir::new("dq");
    let policy = dir.0.join("p.toml");
    let state = dir.0.join("upstream.json");
    std::fs::write(&policy, format!("allow_empty = true\n[upstream]\nspeaker = \"/run/exabgp/limiter-none\"\nstate = {:?}\n", state.display().to_string())).unwrap();
    let _d = daemon(&net, "dq", &["--policy", policy.to_str().unwrap()]);
    let text = scrape(&net);
    let exposed: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).collect();
    let is_exposed = |n: &str| exposed.iter().any(|e| *e == n || format!("{e}_total") == n);

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("grafana/limiter.json")).unwrap()).unwrap();
    let mut queries: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    queries.extend(
        dash["templating"]["list"].as_array().unwrap().iter().filter_map(|v| v["query"].as_str()).map(str::to_owned),
    );
    let alerts = std::fs::read_to_string(root.join("prometheus/limiter-alerts.yml")).unwrap();
    let alert_exprs: Vec<String> =
        alerts.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(|e| e.trim().to_owned()).collect();
    assert_eq!(
        alert_exprs.len(),
        10,
        "drop rate, map fill, reload failures, not attached, a stale group file, upstream session down, upstream rules \
         at cap, escalation capped, an attack going on, a tunnel without backends"
    );
    queries.extend(alert_exprs);

    let mut checked = 0;
    for q in &queries {
        for name in metric_names(q) {
            assert!(is_exposed(&name), "{name} (in {q}) is not exposed; exposed: {exposed:?}");
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} names checked");
}
