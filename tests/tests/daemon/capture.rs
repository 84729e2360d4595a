//! Capture at the driver through the daemon: during a flood of one
//! rate-limited /24 and one the policy denies, `limiter capture -w -
//! --reason rate_limited | tcpdump -r -` shows only the rate-limited
//! source's frames; `limiter capture -w FILE` writes a pcapng whose every
//! frame's comment (read by tshark) names the reason its source earns;
//! the flood is an attack whose record names its pcap, which tshark reads
//! whole (its first frames, then a sample) with the same reasons, and
//! which `limiter replay` takes, giving the denied source every frame
//! dropped again. A third /24 sends under its allowance meanwhile:
//! `limiter capture --passed` shows its frames passed, and the attack's
//! record says what it got (the passed packets of the sources it never
//! refused) within 25% of what it sent.

use std::{
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

const LIMITED: &str = "198.18.41";
const DENIED: &str = "198.18.44";
const CONFORMING: &str = "198.18.50";

/// Each frame of a pcapng as tshark reads it: source address and comment.
fn tshark(path: &Path) -> Vec<(String, String)> {
    let o = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(path)
        .args(["-T", "fields", "-E", "separator=|", "-e", "ip.src", "-e", "frame.comment"])
        .output()
        .expect("tshark (cargo xtask setup installs it)");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (src, comment) = l.split_once('|').unwrap_or((l, ""));
            (src.to_owned(), comment.to_owned())
        })
        .collect()
}

/// Every frame's comment names the reason its source earns (the denied
/// /24's `denied`, the other's `rate_limited`), both are there, and
/// nothing else is; the frames drawn as one in N (`sample=1/N` after the
/// words), counted.
fn reasons_match_sources(frames: &[(String, String)]) -> usize {
    let (mut seen, mut sampled) = ((0, 0), 0);
    for (src, comment) in frames {
        let comment = match comment.split_once(" sample=1/") {
            Some((words, n)) => {
                assert!(n.parse::<u32>().is_ok_and(|n| n > 1 && n.is_power_of_two()), "{comment}");
                sampled += 1;
                words
            }
            None => comment.as_str(),
        };
        let want = if src.starts_with(&format!("{DENIED}.")) {
            seen.0 += 1;
            "verdict=drop reason=denied class=web"
        } else {
            assert!(src.starts_with(&format!("{LIMITED}.")), "a frame from {src}");
            seen.1 += 1;
            "verdict=drop reason=rate_limited class=web"
        };
        assert_eq!(comment, want, "{src}");
    }
    assert!(seen.0 > 0 && seen.1 > 0, "denied {} rate-limited {}", seen.0, seen.1);
    sampled
}

#[test]
#[expect(clippy::too_many_lines, reason = "two live captures and an attack's pcap, read and replayed")]
fn captures_show_what_was_dropped_and_why_live_and_per_attack() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("cp");
    let dir = TempDir::new("capture");
    let policy = dir.0.join("limiter.toml");
    std::fs::write(
        &policy,
        format!(
            "[[class]]\nname = \"web\"\nprotocol = \"udp\"\nports = [7001]\nrate = 1000\nburst = 200\n\n\
             [[override]]\ncidr = \"{DENIED}.0/24\"\naction = \"deny\"\n\n\
             [attacks]\ndrops_per_sec = 2000\nsustain = \"2s\"\nquiet = \"3s\"\n"
        ),
    )
    .unwrap();
    let (socket, file) = (unique_socket("capture"), dir.0.join("attacks.jsonl"));
    let mut cmd = net.b.command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&policy);
    cmd.arg("--socket").arg(&socket).arg("--attacks").arg(&file);
    let (_daemon, log) = spawn_lines(cmd).unwrap();
    wait_for(&log, "attached", scenario::DAEMON_START, &mut String::new()).unwrap();

    // Two captures, open before the flood: rate-limited frames only, into
    // tcpdump; and every drop, into a file.
    let limiter = scenario::locate_bin("limiter").unwrap();
    let mut only = Command::new(&limiter)
        .args(["capture", "-w", "-", "--reason", "rate_limited", "-c", "200", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tcpdump = Command::new("tcpdump")
        .args(["-n", "-r", "-"])
        .stdin(only.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (cargo xtask setup installs it)");
    let all_file = dir.0.join("all.pcapng");
    let all = Command::new(&limiter)
        .args(["capture", "-c", "400", "-w"])
        .arg(&all_file)
        .arg("--socket")
        .arg(&socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let of_passes = Command::new(&limiter)
        .args(["capture", "--passed", "--prefix", &format!("{CONFORMING}.0/24"), "-c", "100", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (only, all, mut of_passes) = (Guard(only), Guard(all), Guard(of_passes));
    let mut passed_lines = of_passes.0.stdout.take().unwrap();
    thread::sleep(Duration::from_millis(500));

    let netload = scenario::locate_bin("netload").unwrap();
    let mac = net.b_mac();
    let flood = |from: &str, pps: u32| {
        let mut c = net.a.command(&netload);
        c.args(["spoof-prefix", "va", &mac, &format!("{B_ADDR}:7001"), from, &pps.to_string(), "8"]);
        Guard(c.stdout(Stdio::null()).spawn().unwrap())
    };
    let began = Instant::now();
    let mut conforming = net.a.command(&netload);
    conforming.args(["spoof-prefix", "va", &mac, &format!("{B_ADDR}:7001"), CONFORMING, "300", "8"]);
    let conforming = conforming.stdout(Stdio::piped()).spawn().unwrap();
    let floods = [flood(LIMITED, 5_000), flood(DENIED, 3_000)];

    // The live captures end at their counts.
    let finish = |mut g: Guard, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = g.0.try_wait().unwrap() {
                let mut err = String::new();
                g.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                assert!(status.success(), "{what}: {status}: {err}");
                println!("{what}: {}", err.trim());
                return;
            }
            assert!(Instant::now() < deadline, "{what} did not end");
            thread::sleep(Duration::from_millis(100));
        }
    };
    finish(only, "capture --reason rate_limited");
    finish(all, "capture -w");
    finish(of_passes, "capture --passed");
    let mut text = String::new();
    passed_lines.read_to_string(&mut text).unwrap();
    let passed: Vec<&str> = text.lines().collect();
    println!("capture --passed: {} lines; the first: {:?}", passed.len(), passed.first());
    assert_eq!(passed.len(), 100);
    for l in &passed {
        assert!(l.contains(&format!(" {CONFORMING}.")) && l.ends_with("verdict=pass reason=admitted class=web"), "{l}");
    }
    let out = tcpdump.wait_with_output().unwrap();
    let lines = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    println!("tcpdump read {} frames; the first: {:?}", lines.len(), lines.first());
    assert_eq!(lines.len(), 200, "{}", String::from_utf8_lossy(&out.stderr));
    let other = lines.iter().find(|l| !l.contains(&format!(" IP {LIMITED}.")) || !l.contains(&format!("> {B_ADDR}.7001")));
    assert!(other.is_none(), "a frame of another source or reason: {other:?}");
    let frames = tshark(&all_file);
    println!("tshark read {} frames of the -w file; the first: {:?}", frames.len(), frames.first());
    assert_eq!(frames.len(), 400);
    assert_eq!(reasons_match_sources(&frames), 0, "a live capture takes every drop");

    // The attack: its record names its pcap.
    thread::sleep(Duration::from_secs(8).saturating_sub(began.elapsed()));
    let sent = conforming.wait_with_output().unwrap();
    let sent = String::from_utf8(sent.stdout).unwrap();
    let sent: u64 = sent.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{sent}"));
    drop(floods);
    let deadline = Instant::now() + Duration::from_secs(10);
    let a = loop {
        let o = scenario::cli(&socket, &["attacks", "-j"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if let Some(a) = v["attacks"].as_array().and_then(|a| a.last()).filter(|a| !a["ended"].is_null()) {
            break a.clone();
        }
        assert!(Instant::now() < deadline, "no attack ended: {v}");
        thread::sleep(Duration::from_millis(500));
    };
    println!("attack {}: pcap {}", a["id"], a["pcap"]);
    let pcap = a["pcap"]["path"].as_str().unwrap_or_else(|| panic!("no pcap in {a}"));
    let kept = a["pcap"]["frames"].as_u64().unwrap();
    assert!(pcap.ends_with(&format!("attacks.jsonl.pcap/{}.pcapng", a["id"])), "{pcap}");
    // The conforming /24 is the one flooding source never refused (the
    // link's own IPv6 neighbour discovery passes beside it, a few
    // packets); it sent all its packets while the attack went on.
    let c = &a["conforming"];
    println!("conforming: {c} (the /24 sent {sent})");
    assert!(c["prefixes"].as_u64().is_some_and(|n| n >= 1), "{a}");
    let got = c["packets"].as_u64().unwrap();
    assert!(got.abs_diff(sent) * 4 <= sent, "{got} passed of the never refused, {sent} sent");
    let frames = tshark(Path::new(pcap));
    println!("tshark read {} frames of the attack's pcap; the first: {:?}", frames.len(), frames.first());
    assert_eq!(frames.len() as u64, kept);
    // Its first 1,000 frames, then a sample of the rest: one in the power
    // of two at or above a second's refusals / 100, so 50 to 100 a
    // second, for the 6 to 7 s left of the attack (297 and 384 seen).
    assert!((1_000 + 200..=1_000 + 2_000).contains(&kept), "{kept} frames kept");
    let sampled = reasons_match_sources(&frames);
    println!("{sampled} of them drawn as one in N");
    assert!(sampled > 0 && sampled < frames.len() - 1_000 + 1, "{sampled}");

    // Replayed under the same policy: the denied source's frames are all
    // dropped again.
    let o = Command::new(&limiter).args(["replay", "--pcap", pcap, "--policy"]).arg(&policy).arg("-j").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    println!("replay: {report}");
    let row = |prefix: &str| {
        report["prefixes"].as_array().unwrap().iter().find(|r| r["prefix"] == prefix).cloned().unwrap_or_default()
    };
    let denied_frames = frames.iter().filter(|(s, _)| s.starts_with(&format!("{DENIED}."))).count() as u64;
    let denied = row(&format!("{DENIED}.0/24"));
    assert_eq!(denied["packets"].as_u64(), Some(denied_frames), "{report}");
    assert_eq!(denied["dropped"].as_u64(), Some(denied_frames), "{report}");
    assert_eq!(report["frames"].as_u64(), Some(kept));
}
