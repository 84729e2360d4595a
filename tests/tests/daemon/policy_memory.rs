//! Policy memory: a TOML document tree costs far more than its text
//! (about 2 KiB an override table, 160 bytes an array element), so a
//! 32 MiB policy parsed whole would take 1.5 GB of daemon memory. The
//! file is cut up by TOML's
//! lexer and parsed in bounded batches: the daemon's and the client's
//! peak stay within a few times the file's size, what the daemon keeps is
//! about the new policy, and a document of values a policy cannot use is
//! refused before any tree is built.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, spawn_lines, unique_socket, wait_for},
};

fn status_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap()
}

fn ratio(a: u64, b: u64) -> f64 {
    f64::from(u32::try_from(a).unwrap()) / f64::from(u32::try_from(b).unwrap())
}

/// Run `c` to its end: whether it succeeded, its stderr, and its own
/// peak resident size in KiB: its `VmHWM`, read until it ends (the high
/// water mark of the memory it exec'd into, so neither this process's
/// size, which a fork or exec carries into `ru_maxrss`, nor any other
/// child of the tier's one process counts).
fn run_measured(mut c: Command, tmp: &Path) -> (bool, String, u64) {
    let err_path = tmp.join("client.err");
    let err = std::fs::File::create(&err_path).unwrap();
    let mut child = c.stdout(std::process::Stdio::null()).stderr(err).spawn().unwrap();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_mins(5);
    let status = loop {
        // The mark only grows: the last read before the end is its peak
        // (after parsing, the client waits seconds for the daemon).
        if let Some(kb) = std::fs::read_to_string(&status_path)
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok())
        {
            peak = peak.max(kb);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the client did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(peak > 0, "no VmHWM read of the client");
    (status.success(), std::fs::read_to_string(&err_path).unwrap_or_default(), peak)
}

/// 131,072 deny overrides, each followed by a comment line, up to about
/// 31 MiB: the most overrides a policy may hold, in a file near the
/// 32 MiB cap.
fn largest_policy(path: &Path) -> u64 {
    use std::fmt::Write as _;
    let pad = format!("# {}\n", "x".repeat(180));
    let mut text = String::from("rate = 1000\nburst = 2000\n");
    for i in 0u32..131_072 {
        let [_, a, b, c] = i.to_be_bytes();
        let _ = write!(text, "[[override]]\ncidr = \"{}.{b}.{c}.0/24\"\naction = \"deny\"\n{pad}", 100 + a);
    }
    std::fs::write(path, &text).unwrap();
    text.len() as u64
}

#[test]
fn a_policy_near_the_size_cap_costs_a_few_times_its_size() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("pmem");
    let tmp = TempDir::new("pmem");
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, "rate = 1000\nburst = 2000\n").unwrap();
    let socket = unique_socket("pmem");
    let bin = scenario::locate_bin("limiter").unwrap();
    let mut c = net.b.net_command(&bin);
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&policy).arg("--socket").arg(&socket);
    let (daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&log, "metrics on", Duration::from_secs(20), &mut seen).unwrap();
    let pid = daemon.0.id();
    std::thread::sleep(Duration::from_millis(500));
    let (hwm0, rss0) = (status_kb(pid, "VmHWM:"), status_kb(pid, "VmRSS:"));

    let big = tmp.0.join("big.toml");
    let size_kb = largest_policy(&big) / 1024;
    let t = Instant::now();
    let mut apply = Command::new(&bin);
    apply.args(["policy", "apply"]).arg(&big).arg("--socket").arg(&socket);
    let (ok, stderr, client_kb) = run_measured(apply, &tmp.0);
    let took = t.elapsed();
    assert!(ok, "{stderr}");
    std::thread::sleep(Duration::from_secs(1));
    let (hwm1, rss1) = (status_kb(pid, "VmHWM:"), status_kb(pid, "VmRSS:"));
    println!(
        "a {size_kb} KiB policy of 131,072 overrides applied in {took:?}: daemon peak +{} KiB ({:.1}x the file), kept +{} KiB; client peak {client_kb} KiB ({:.1}x)",
        hwm1 - hwm0,
        ratio(hwm1 - hwm0, size_kb),
        rss1.saturating_sub(rss0),
        ratio(client_kb, size_kb),
    );
    assert!(hwm1 - hwm0 <= 4 * size_kb, "the daemon's peak grew {} KiB for a {size_kb} KiB file", hwm1 - hwm0);
    assert!(rss1.saturating_sub(rss0) <= 2 * size_kb, "the daemon kept {} KiB", rss1 - rss0);
    assert!(client_kb <= 3 * size_kb, "the client peaked at {client_kb} KiB");

    // 30 MiB of one array: refused where it grows too big, with no tree.
    let arr = tmp.0.join("arr.toml");
    let text = format!("rate = 1000\nburst = 2000\nzzz = [{}]\n", "0,".repeat(15 << 20));
    std::fs::write(&arr, &text).unwrap();
    let o = Command::new(&bin).args(["policy", "apply"]).arg(&arr).arg("--socket").arg(&socket).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    println!("an array of 15,728,640 values: {}", err.trim());
    assert!(!o.status.success());
    assert!(err.contains(&format!("{}:3: (document): more than", arr.display())), "{err}");
    let hwm2 = status_kb(pid, "VmHWM:");
    assert!(hwm2 - hwm1 <= 2 * (text.len() as u64 / 1024), "the daemon's peak grew {} KiB", hwm2 - hwm1);
    let s = Command::new(&bin).args(["status", "--json", "--socket"]).arg(&socket).output().unwrap();
    let s: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(s["policy_version"].as_u64(), Some(2), "the big policy stays in force: {s}");
}
