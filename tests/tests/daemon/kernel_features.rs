//! A kernel without the raw SYN cookie helpers (kernel 6.0+ built with
//! `CONFIG_SYN_COOKIES`): the daemon loads the object built without SYN
//! cookies, and the policy decides (`missing_kernel_feature`) whether a
//! policy that asks for cookies is refused, in one line naming its class,
//! or runs without them, said at start, in `limiter status`, in its
//! summary and in `limiter_kernel_lacks_syn_cookies`.
//!
//! No kernel these tests run on lacks those helpers alone (6.1 and later
//! have them, 5.10 lacks others too), so a test build of the daemon is
//! told to count them missing (`LIMITER_TEST_KERNEL_LACKS`); the object
//! it loads then is the real one without cookies, on the real kernel.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use limiter::{dataplane::DataPlane, policy::SynCookies};
use limiter_common::Reason;
use limiter_tests::{
    kernel::{self, TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, FLOOD_SRC, delivered, metric, scrape, spawn_lines, unique_socket, wait_for},
    tcp::{Seg, ack_of, policy},
};

const T0: u64 = 9_000_000_000_000;
const MS: u64 = 1_000_000;
const XDP_TX: u32 = 3;
const LACKS: &str = "bpf_tcp_raw_gen_syncookie_ipv4,bpf_tcp_raw_check_syncookie_ipv6";

/// The reasons and actions of three SYNs and an ACK from one client.
fn syns_and_ack(l: &mut DataPlane, src: &str) -> Vec<(Reason, u32)> {
    let syn = Seg::syn(src.parse::<IpAddr>().unwrap(), 0);
    let frames = [syn.bytes(), syn.bytes(), syn.bytes(), ack_of(&syn, 7).bytes()];
    let mut out = Vec::new();
    for (i, f) in (0u64..).zip(frames) {
        let before = l.maps.totals().unwrap();
        let (action, _) = l.run_out(T0 + i * MS, &f).unwrap();
        let delta = l.maps.totals().unwrap().since(&before);
        out.push((Reason::ALL.into_iter().find(|r| delta.get(*r).packets == 1).expect("one reason"), action));
    }
    out
}

/// The same policy with the flag for cookies set: the production object
/// answers with a SYN-ACK built in XDP, the object without cookies never
/// does (and calls no cookie helper: it loads where they are missing).
#[test]
fn the_object_without_cookies_charges_syns_that_the_full_one_answers() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let c = policy(SynCookies::Always, None, None).compile(1).unwrap();
    assert_ne!(c.config.flags & limiter_common::flags::SYN_COOKIES, 0);
    let full = syns_and_ack(&mut kernel::open(&c), "198.18.7.9");
    assert!(full.contains(&(Reason::SynCookieSent, XDP_TX)), "{full:?}");
    let without = syns_and_ack(&mut kernel::open_without_syn_cookies(&c), "198.18.7.9");
    println!("full object: {full:?}\nwithout SYN cookies: {without:?}");
    assert!(without.iter().all(|(r, a)| *r == Reason::Admitted && *a != XDP_TX), "{without:?}");
}

/// 10 packets a second, burst 10, and SYN cookies for 443; `extra` first.
fn policy_text(extra: &str) -> String {
    format!(
        "{extra}\nrate = 10\nburst = 10\n\n[[class]]\nname = \"web\"\nprotocol = \"tcp\"\nports = [443]\nsyn = true\n\
         rate = 50\nburst = 50\nsyn_cookies = \"always\"\n"
    )
}

fn daemon(net: &VethPair, policy: &Path, socket: &Path, pins: &Path) -> Command {
    // `nsenter`, not `ip netns exec`: the pins must outlive the process.
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--pin", "--policy"]).arg(policy);
    c.arg("--socket").arg(socket).arg("--pin-dir").arg(pins);
    c.env("LIMITER_TEST_KERNEL_LACKS", LACKS);
    c
}

/// Run `c` to its end, killed after `limit` (a daemon that started).
fn exit_within(mut c: Command, limit: Duration) -> Output {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let at = Instant::now();
    while child.try_wait().unwrap().is_none() && at.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

#[test]
fn without_the_cookie_helpers_cookies_are_refused_or_run_without_as_the_policy_says() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = TempDir::new("kfeat");
    let file = tmp.0.join("p.toml");
    let pins = scenario::Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-kfeat-{}", std::process::id())));
    let socket = unique_socket("kfeat");
    let net = VethPair::new("kf");
    for src in [FLOOD_SRC, CONFORM_SRC] {
        net.add_source(src);
    }

    // As the policy asks by default: refused, in one line naming the
    // class's key, where it is, what the kernel lacks and the way out;
    // nothing pinned.
    std::fs::write(&file, policy_text("")).unwrap();
    let out = exit_within(daemon(&net, &file, &socket, &pins.0), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success(), "the daemon started");
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or_default();
    assert!(last.contains("p.toml:") && last.contains("class[0].syn_cookies"), "{last}");
    assert!(last.contains("lacks bpf_tcp_raw_gen_syncookie_ipv4"), "{last}");
    assert!(last.contains("missing_kernel_feature = \"run-without\""), "{last}");
    assert!(!pins.0.exists(), "{} was made", pins.0.display());

    // Told to run without: it does, and says so everywhere.
    std::fs::write(&file, policy_text("missing_kernel_feature = \"run-without\"")).unwrap();
    let (_daemon, _rx) = {
        let (g, rx) = spawn_lines(daemon(&net, &file, &socket, &pins.0)).unwrap();
        let mut log = String::new();
        wait_for(&rx, "attached", scenario::DAEMON_START, &mut log).unwrap();
        println!("{log}");
        assert!(log.contains("loading the program without SYN cookies"), "{log}");
        assert!(log.contains("syn cookies OFF: kernel"), "{log}");
        (g, rx)
    };
    let status = String::from_utf8_lossy(&scenario::cli(&socket, &["status"]).stdout).into_owned();
    println!("{status}");
    assert!(status.contains("syn cookies     NONE: kernel"), "{status}");
    assert!(status.contains("class web runs without them"), "{status}");
    assert_eq!(metric(&scrape(&net), "limiter_kernel_lacks_syn_cookies"), 1);
    // It protects as ever: a flood held to its burst, a sender within its
    // allowance untouched.
    let flood = delivered(&net, FLOOD_SRC, 300);
    let conform = delivered(&net, CONFORM_SRC, 8);
    println!("flood: {flood} of 300 delivered (rate 10/s, burst 10); conforming: {conform} of 8");
    // Generous for an emulated guest, whose sending takes seconds.
    assert!((10..=100).contains(&flood), "flood: {flood} of 300");
    assert_eq!(conform, 8);

    // A reload that drops `run-without` while asking for cookies is refused,
    // and the running policy stays.
    let before = String::from_utf8_lossy(&scenario::cli(&socket, &["status"]).stdout).into_owned();
    std::fs::write(&file, policy_text("")).unwrap();
    let o = scenario::cli(&socket, &["policy", "apply", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "applied: {}", String::from_utf8_lossy(&o.stdout));
    assert!(err.contains("class[0].syn_cookies") && err.contains("run-without"), "{err}");
    let after = String::from_utf8_lossy(&scenario::cli(&socket, &["status"]).stdout).into_owned();
    let version = |s: &str| s.lines().find(|l| l.starts_with("policy")).map(str::to_owned);
    assert_eq!(version(&after), version(&before), "{after}");
}
