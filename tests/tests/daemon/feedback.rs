//! Feedback from the tenant layer over HTTP, under the governor: a posted
//! penalty drops its prefix in XDP at once and expires on time; the
//! governor refuses past its cap, too wide a prefix and too long a TTL,
//! counts each refusal, and in shadow mode only lists and logs.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, FLOOD_SRC, Guard, spawn_lines, unique_socket, wait_for},
};

const TOKEN: &str = "feedback-test-token-0123456789";
/// A host in FLOOD_SRC's /24 bucket that exceeds nothing.
const NEIGHBOUR: &str = "198.18.1.200";

struct Running {
    net: VethPair,
    _daemon: Guard,
    log: std::sync::mpsc::Receiver<String>,
    _tmp: TempDir,
}

fn start(tag: &str, shadow: bool) -> Running {
    start_with(tag, shadow, "")
}

/// Like [`start`], with `extra` appended to the `[feedback]` section's
/// table (for example a `[feedback.escalate]` table).
fn start_with(tag: &str, shadow: bool, extra: &str) -> Running {
    require_root();
    let net = VethPair::new(tag);
    net.add_source(FLOOD_SRC);
    let tmp = TempDir::new(tag);
    let policy = limiter_tests::feedback::policy(
        &tmp.0,
        TOKEN,
        &format!("max_denied = 1\nmin_v4_prefix = 16\nmax_ttl = \"1m\"\nshadow = {shadow}\n{extra}"),
    );
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(unique_socket(tag));
    let (daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&log, "metrics on", Duration::from_secs(20), &mut seen).unwrap();
    assert!(seen.contains("feedback on http://127.0.0.1:9465/v1/penalties"), "{seen}");
    Running { net, _daemon: daemon, log, _tmp: tmp }
}

/// An HTTP request to the daemon's loopback, from its namespace: the
/// status code and the body.
fn http(r: &Running, port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    scenario::http(&r.net.b, port, method, path, token, body)
}

fn post(r: &Running, body: &str) -> (u16, String) {
    http(r, 9465, "POST", "/v1/penalties", Some(TOKEN), body)
}

/// Send `n` UDP packets from FLOOD_SRC in a second; how many arrived.
fn delivered(r: &Running, n: u64) -> u64 {
    scenario::delivered(&r.net, FLOOD_SRC, n)
}

#[test]
fn a_penalty_drops_its_prefix_at_once_and_the_governor_holds() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("fb", false);
    assert_eq!(delivered(&r, 50), 50);
    let (code, _) = http(&r, 9465, "POST", "/v1/penalties", None, r#"{"prefix":"198.18.1.0/24","ttl":"3s"}"#);
    assert_eq!(code, 403, "no token");
    let (code, _) = http(&r, 9465, "POST", "/v1/penalties", Some("wrong-token-0123456789abc"), "{}");
    assert_eq!(code, 403, "wrong token");

    let (code, body) = post(&r, r#"{"prefix":"198.18.1.0/24","ttl":"3s","reason":"credential stuffing"}"#);
    let set_at = Instant::now();
    assert_eq!(code, 200, "{body}");
    // In XDP at once: the very next packets are dropped.
    assert_eq!(delivered(&r, 50), 0, "the penalty did not drop the prefix");
    let (code, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
    assert_eq!(code, 200);
    let j: serde_json::Value = serde_json::from_str(&list).unwrap();
    let p = &j["penalties"][0];
    assert_eq!(
        (p["cidr"].as_str(), p["origin"].as_str(), p["reason"].as_str()),
        (Some("198.18.1.0/24"), Some("feedback"), Some("credential stuffing")),
        "{j}"
    );
    assert!(p["expires_in_secs"].as_u64().is_some_and(|s| s <= 3), "{j}");

    // The governor: past its cap (1), too wide, too long.
    let (code, body) = post(&r, r#"{"prefix":"198.18.2.0/24","ttl":"3s"}"#);
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("governor: cap"), "{body}");
    let (code, body) = post(&r, r#"{"prefix":"198.0.0.0/8","ttl":"3s"}"#);
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("governor: too_wide"), "{body}");
    let (code, body) = post(&r, r#"{"prefix":"198.18.1.0/24","ttl":"2h"}"#);
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("governor: ttl_too_long"), "{body}");
    let (code, _) = post(&r, r#"{"prefix":"not a prefix","ttl":"3s"}"#);
    assert_eq!(code, 422);
    let (code, _) =
        post(&r, &format!("{{\"prefix\":\"198.18.1.0/24\",\"ttl\":\"3s\",\"reason\":\"{}\"}}", "x".repeat(20_000)));
    assert_eq!(code, 413, "an oversized body");

    // Expired on time: traffic passes again, the list is empty.
    while set_at.elapsed() < Duration::from_secs(5) {
        let (_, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
        if !list.contains("198.18.1.0/24") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lifted = set_at.elapsed();
    println!("a 3 s penalty from feedback was lifted {lifted:?} after it was posted");
    assert!(lifted >= Duration::from_secs(2) && lifted < Duration::from_secs(5), "{lifted:?}");
    assert_eq!(delivered(&r, 50), 50);
    // Each decision counted.
    let (_, m) = http(&r, 9464, "GET", "/metrics", None, "");
    for line in [
        r#"limiter_feedback_decisions_total{result="applied"} 1"#,
        r#"limiter_feedback_decisions_total{result="refused_cap"} 1"#,
        r#"limiter_feedback_decisions_total{result="refused_too_wide"} 1"#,
        r#"limiter_feedback_decisions_total{result="refused_ttl_too_long"} 1"#,
        r#"limiter_feedback_decisions_total{result="refused_bad_request"} 1"#,
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in metrics");
    }
}

#[test]
fn in_shadow_mode_a_penalty_is_listed_and_not_enforced() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("fbsh", true);
    let (code, body) = post(&r, r#"{"prefix":"198.18.1.0/24","ttl":"30s","reason":"probing"}"#);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("shadow"), "{body}");
    assert_eq!(delivered(&r, 50), 50, "a shadow penalty dropped traffic");
    let (_, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
    assert!(list.contains("feedback (shadow)") && list.contains("probing"), "{list}");
}

/// Automatic escalation: a proven address rate-limited at about 7,000
/// drops/s for 2 s is denied by the daemon itself (origin "escalation",
/// under the governor): the address, never its /24 (were the bucket
/// denied, a neighbour that exceeded nothing would get 0/250). Its neighbour in the same bucket keeps its allowance while
/// the flood goes on; a source under its rate is not escalated; the deny
/// drops in XDP.
#[test]
fn an_address_dropped_above_the_threshold_long_enough_is_escalated_alone() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start_with(
        "fbes",
        false,
        "\n[feedback.escalate]\ndrops_per_sec = 2000\nsustained = \"2s\"\ndeny_for = \"30s\"\n",
    );
    let netload = scenario::locate_bin("netload").unwrap();
    let dst = format!("{}:{}", limiter_tests::netns::B_ADDR, scenario::PORT);
    let neighbour = NEIGHBOUR;
    r.net.add_source(scenario::CONFORM_SRC);
    r.net.add_source(neighbour);
    // Both sources proved their addresses (a TCP handshake the kernel
    // accepted): only the drops of proven addresses count.
    let _proofs = [FLOOD_SRC, scenario::CONFORM_SRC]
        .map(|s| scenario::tcp_handshake(&r.net, s, 7000 + u16::from(s == FLOOD_SRC)));
    // The flood: 8,000/s against a rate of 1,000/s; the other source at
    // 500/s stays under its rate.
    let flood = Guard(
        r.net.a.command(&netload).args(["send", FLOOD_SRC, &dst, "8000", "8"]).stdout(Stdio::null()).spawn().unwrap(),
    );
    let calm = Guard(
        r.net
            .a
            .command(&netload)
            .args(["send", scenario::CONFORM_SRC, &dst, "500", "8"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    let want = format!("{FLOOD_SRC}/32");
    let mut list = String::new();
    while start.elapsed() < Duration::from_secs(8) {
        (_, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
        if list.contains(&want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = start.elapsed();
    println!("escalated {after:?} after the flood began (sustained = 2 s)");
    let j: serde_json::Value = serde_json::from_str(&list).expect(&list);
    let p = &j["penalties"][0];
    let log: String = r.log.try_iter().map(|l| l + "\n").collect();
    assert_eq!((p["cidr"].as_str(), p["origin"].as_str()), (Some(want.as_str()), Some("escalation")), "{j}\n{log}");
    assert_eq!(j["penalties"].as_array().map(Vec::len), Some(1), "{j}");
    assert!(p["reason"].as_str().is_some_and(|r| r.starts_with("escalation: about ")), "{j}");
    assert!(p["expires_in_secs"].as_u64().is_some_and(|s| (25..=30).contains(&s)), "{j}");
    assert!(after >= Duration::from_secs(2) && after < Duration::from_secs(6), "{after:?}");
    // The flood goes on, denied in XDP before its bucket is charged: the
    // neighbour in its /24 is served in full (the calm source stops
    // first: the receiver counts the first 50 packets of any source).
    drop(calm);
    std::thread::sleep(Duration::from_millis(300));
    let served = scenario::delivered(&r.net, neighbour, 50);
    println!("the neighbour {neighbour} got {served}/50 during the escalated flood");
    assert_eq!(served, 50, "the neighbour lost its allowance");
    drop(flood);
    assert_eq!(delivered(&r, 50), 0, "the escalated deny does not drop the address");
    assert_eq!(scenario::delivered(&r.net, scenario::CONFORM_SRC, 50), 50);
    let (_, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
    assert!(!list.contains(&format!("{}/32", scenario::CONFORM_SRC)), "a source under its rate was escalated: {list}");
    let (_, m) = http(&r, 9464, "GET", "/metrics", None, "");
    for line in [
        "limiter_escalations_total 1",
        r#"limiter_feedback_decisions_total{result="applied"} 1"#,
        r#"limiter_deny_networks{origin="escalation"} 1"#,
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in metrics");
    }
}

/// A penalty's `reason` with a newline and ANSI escapes must not reach
/// the log raw (a forged log line) nor the list: its control characters
/// are escaped everywhere it shows.
#[test]
fn a_reason_cannot_forge_a_log_line_or_drive_a_terminal() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("fbcc", false);
    let body = r#"{"prefix":"198.18.1.0/24","ttl":"30s","reason":"abuse\nlimiter: FORGED line\u001b[31m red"}"#;
    let (code, resp) = post(&r, body);
    assert_eq!(code, 200, "{resp}");
    let (_, list) = http(&r, 9465, "GET", "/v1/penalties", Some(TOKEN), "");
    let j: serde_json::Value = serde_json::from_str(&list).unwrap();
    let reason = j["penalties"][0]["reason"].as_str().unwrap().to_owned();
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
    assert!(reason.contains("abuse\\u{a}limiter: FORGED line\\u{1b}[31m red"), "{reason:?}");
    std::thread::sleep(Duration::from_millis(300));
    let log: Vec<String> = r.log.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("FORGED")), "the penalty was not logged: {log:?}");
    assert!(
        log.iter().all(|l| !l.starts_with("limiter: FORGED") && !l.contains('\u{1b}')),
        "a forged line or an escape reached the log: {log:?}"
    );
}

/// The token file: a FIFO as `token_file` must not hang the daemon after
/// it has attached (or make it deaf to SIGTERM), a 16-letter token of one
/// letter in a 0644 file must not be taken silently, and a rotated token
/// file must be taken on SIGHUP (not the old token answering and the new
/// one getting 403), nor a changed `listen` ignored, while
/// `policy show` printed the new port.
#[test]
fn the_token_file_is_checked_before_attaching_and_read_again_on_sighup() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("fbtk");
    let tmp = TempDir::new("fbtk");
    let token = tmp.0.join("token");
    let policy = tmp.0.join("policy.toml");
    let write_policy = |port: u16| {
        std::fs::write(
            &policy,
            format!(
                "rate = 1000\nburst = 2000\n\n[feedback]\nlisten = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
                token.display()
            ),
        )
        .unwrap();
    };
    write_policy(9465);
    let run = || {
        let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
        c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"])
            .arg(&policy)
            .arg("--socket")
            .arg(unique_socket("fbtk"));
        c
    };
    // A FIFO: refused at once, nothing attached.
    let c = std::ffi::CString::new(token.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = Instant::now();
    let o = run().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success() && err.contains("not a regular file"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let link = net.b.command("ip").args(["link", "show", B_IF]).output().unwrap();
    assert!(!String::from_utf8_lossy(&link.stdout).contains("xdp"), "a program was attached");
    std::fs::remove_file(&token).unwrap();

    // A weak token in a 0644 file: taken, with a warning for each.
    std::fs::write(&token, "aaaaaaaaaaaaaaaa\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (daemon, log) = spawn_lines(run()).unwrap();
    let mut seen = String::new();
    wait_for(&log, "metrics on", Duration::from_secs(20), &mut seen).unwrap();
    assert!(seen.contains("readable by group or others (mode 644)"), "{seen}");
    assert!(seen.contains("has 1 distinct characters"), "{seen}");
    let pid = i32::try_from(daemon.0.id()).unwrap();
    let r = Running { net, _daemon: daemon, log, _tmp: tmp };
    let get = |t: &str| http(&r, 9465, "GET", "/v1/penalties", Some(t), "").0;
    assert_eq!(get("aaaaaaaaaaaaaaaa"), 200);
    // Rotated, and listen moved: SIGHUP takes the token, says the listen
    // needs a restart, and policy show shows what is in force.
    let rotated = "0f8e3c1a9b7d6e5f4a3b2c1d0e9f8a7b";
    std::fs::write(&token, format!("{rotated}\n")).unwrap();
    write_policy(9466);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let mut seen = String::new();
    wait_for(&r.log, "feedback token read again", Duration::from_secs(10), &mut seen).unwrap();
    assert!(seen.contains("take effect at the next restart"), "{seen}");
    assert_eq!(get(rotated), 200, "the rotated token");
    assert_eq!(get("aaaaaaaaaaaaaaaa"), 403, "the old token still answers");
    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["policy", "show", "--socket"])
        .arg(unique_socket("fbtk"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("listen = \"127.0.0.1:9465\"") && shown.contains("in force until a restart"), "{shown}");
}
