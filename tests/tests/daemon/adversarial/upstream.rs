//! Upstream rules under attack (hardening round 4), with ExaBGP and BIRD
//! in the loop (what the transit holds is read from BIRD's tables):
//!
//! - U1: a spoofed flood over 256 /24s under link pressure cannot crowd
//!   the operator out: pressure holds at most its share of `max_rules`
//!   and of the change budget, the operator's rules reach the router at
//!   once, at the cap the operator's take automation's places, and a
//!   refusal states the real counts.
//! - U2: a spoofed "DNS answer" flood from a victim's /24 (and /64) gets
//!   a pressure rule that matches what this host drops (UDP from port
//!   53, to this host's address), rate-limited to the prefix's whole
//!   allowance, never the victim's whole prefix to every destination.
//! - U7: a destination of the other family is refused, nothing sent.
//! - U8: the routes a restarted ExaBGP lost are given back at once, not
//!   charged to the change budget.
//! - U9: ExaBGP started as docs/upstream.md says, word for word, with
//!   Debian's own `/etc/exabgp/exabgp.env` (which drops to the user
//!   `exabgp`), takes the daemon's rules to the router.
//! - L2: an operator verb whose reader goes ends quietly (SIGPIPE), never
//!   a panic.

use std::{
    os::unix::process::CommandExt as _,
    time::{Duration, Instant},
};

use limiter_tests::{
    bgp::{Bgp, routes},
    kernel::require_root,
    netns::{B_ADDR, B_IF},
    scenario::{self, PORT},
};

use crate::upstream::{Bed, SESSION, bed, list, ok, refused, run, until};

fn v4(b: &Bgp) -> String {
    b.flows(false)
}

fn v6(b: &Bgp) -> String {
    b.flows(true)
}

/// Rules of the list by trigger.
fn by(l: &serde_json::Value, trigger: &str) -> usize {
    l["rules"].as_array().unwrap().iter().filter(|r| r["by"] == trigger).count()
}

#[test]
fn link_pressure_never_crowds_the_operator_out() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    // 8 rules, 8 changes a minute; pressure after 1 s over 1 Mbit/s; 50
    // of the top droppers wanted (as many /24s as a spoofer likes).
    let extra = "max_rules = 8\nlink_capacity = 1000000\npressure_percent = 50\npressure_sustained = \"1s\"\nhold_down \
                 = \"5m\"\npressure_prefixes = 50\n";
    let Bed { bgp, net, socket, policy, _dir } = bed("u1", "198.18.40.0/24", extra);
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("rate = 1000\nburst = 1000", "rate = 10\nburst = 10")
        .replace("max_changes_per_minute = 600", "max_changes_per_minute = 8");
    std::fs::write(&policy, text).unwrap();
    let _daemon = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());

    // 20,000 packets/s over every /24 of 198.19.0.0/16 for 25 s.
    let mut flood = net.a.command(env!("CARGO_BIN_EXE_netload"));
    flood.args(["spoof-prefix", "va", &net.b_mac(), &format!("{B_ADDR}:{PORT}"), "198.19", "20000", "25"]);
    let flood = flood.stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Pressure takes its share: 6 of 8 (and 6 of the 8 changes a minute).
    let full = until(&bgp, Duration::from_secs(20), |_| by(&list(&socket), "pressure") >= 6);
    let l = list(&socket);
    println!("pressure rules after {full:?}: {} wanted, status {}", by(&l, "pressure"), l["status"]);
    assert!(full.is_some(), "pressure never took its share: {l}");
    assert_eq!(by(&l, "pressure"), 6, "pressure past its share of max_rules: {l}");

    // The operator's rules go at once, though pressure wants 50.
    let asked = Instant::now();
    ok(&scenario::cli(&socket, &["prefix", "deny", "198.18.201.0/24", "--upstream", "--ttl", "10m"]));
    ok(&scenario::cli(&socket, &["upstream", "announce", "198.18.202.0/24", "--ttl", "10m"]));
    let both = |b: &Bgp| v4(b).contains("src 198.18.201.0/24") && v4(b).contains("src 198.18.202.0/24");
    let reached = until(&bgp, Duration::from_secs(15), both);
    println!("the operator's two rules at the router after {:?} (pressure wanting 50)", asked.elapsed());
    assert!(reached.is_some(), "the operator's rules did not reach the router\n{}\n{}", v4(&bgp), list(&socket));

    // At the cap, each operator rule takes a pressure rule's place; when
    // the operator's own rules fill it, the refusal says so.
    for n in 203..=208 {
        ok(&scenario::cli(&socket, &["upstream", "announce", &format!("198.18.{n}.0/24"), "--ttl", "10m"]));
    }
    let l = list(&socket);
    assert_eq!((by(&l, "operator"), by(&l, "pressure")), (8, 0), "{l}");
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.18.209.0/24"]));
    println!("refused: {e}");
    assert!(e.contains("8 the operator's, 0 escalation's, 0 link pressure's"), "{e}");
    let o = flood.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The pressure rule of a reflection class's flood: its protocol and
/// source port, this host's address, the prefix's whole allowance.
#[test]
fn a_spoofed_reflection_flood_gets_no_victim_rate_limited_whole() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let extra = "link_capacity = 1000000\npressure_percent = 50\npressure_sustained = \"1s\"\nhold_down = \
                 \"5m\"\npressure_prefixes = 5\nmin_v6_prefix = 48\n";
    let Bed { bgp, net, socket, policy, _dir } = bed("u2", "198.18.40.0/24", extra);
    // The default class at 1,000/s and a reflection class at 50/s: the
    // prefix's whole allowance is 1,050 packets/s, 1,575,000 B/s.
    let class = "\n[[class]]\nname = \"reflection\"\nprotocol = \"udp\"\nsource_ports = [53]\nrate = 50\nburst = 50\n";
    let text = std::fs::read_to_string(&policy).unwrap().replace("\n[upstream]", &format!("{class}\n[upstream]"));
    std::fs::write(&policy, text).unwrap();
    net.b.ip(&format!("-6 addr add 2001:2::2/64 dev {B_IF} nodad"));
    let _daemon = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());
    let flood = |dst: String, from: &str| {
        let mut f = net.a.command(env!("CARGO_BIN_EXE_netload"));
        f.args(["spoof-prefix", "va", &net.b_mac(), &dst, from, "20000", "8", "53"]);
        f.stdout(std::process::Stdio::piped()).spawn().unwrap()
    };
    let floods = [flood(format!("{B_ADDR}:{PORT}"), "198.18.22"), flood(format!("[2001:2::2]:{PORT}"), "2001:2:22::")];
    let seen = until(&bgp, Duration::from_secs(12), |b| {
        v4(b).contains("src 198.18.22.0/24") && v6(b).contains("src 2001:2:22::/56")
    });
    let (t4, t6) = (v4(&bgp), v6(&bgp));
    for f in floods {
        let o = f.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    println!("after {seen:?}:\n{t4}\n{t6}\n{}", list(&socket));
    assert!(seen.is_some(), "no pressure rules\n{t4}\n{t6}");
    // What this host drops, to this host, at the whole allowance (the
    // float 1.575e6 is 0x49c042c0).
    assert_eq!(routes(&t4), ["flow4 { dst 198.18.0.2/32; src 198.18.22.0/24; proto 17; sport 53; }"], "{t4}");
    assert!(t4.contains("(generic, 0x80060000, 0x49c042c0)"), "{t4}");
    assert_eq!(routes(&t6), ["flow6 { dst 2001:2::2/128; src 2001:2:22::/56; next header 17; sport 53; }"], "{t6}");
    assert!(t6.contains("(generic, 0x80060000, 0x49c042c0)"), "{t6}");
}

/// A destination of the other family is refused (U7); routes a restarted
/// ExaBGP lost come back at once, past a change budget of 2 a minute (U8).
#[test]
fn a_restarted_speaker_gets_its_routes_back_outside_the_change_budget() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let Bed { mut bgp, net, socket, policy, _dir } = bed("u8", "198.18.40.0/24", "");
    let _daemon = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.51.100.0/24", "--destination", "2001:db8::1/128"]));
    assert!(e.contains("not of the source 198.51.100.0/24's address family"), "{e}");
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.51.100.0/24", "--rate-limit", "18446744073709551615"]));
    assert!(e.contains("the most a FlowSpec rule carries"), "{e}");
    assert!(list(&socket)["rules"].as_array().unwrap().is_empty());

    for n in 91..=98 {
        ok(&scenario::cli(&socket, &["upstream", "announce", &format!("198.18.{n}.0/24"), "--ttl", "1h"]));
    }
    assert!(until(&bgp, Duration::from_secs(15), |b| routes(&v4(b)).len() == 8).is_some(), "{}", v4(&bgp));
    let text = std::fs::read_to_string(&policy).unwrap().replace("max_changes_per_minute = 600", "max_changes_per_minute = 2");
    std::fs::write(&policy, text).unwrap();
    ok(&scenario::cli(&socket, &["policy", "apply"]));
    bgp.kill_exabgp();
    assert!(until(&bgp, Duration::from_secs(30), |b| routes(&v4(b)).is_empty()).is_some(), "{}", v4(&bgp));
    bgp.start_exabgp();
    assert!(bgp.wait_established(SESSION), "no session again\n{}", bgp.exabgp_log());
    let back = until(&bgp, Duration::from_secs(20), |b| routes(&v4(b)).len() == 8);
    println!("8 of 8 routes at the router {back:?} after the session was back: {}", list(&socket)["status"]);
    assert!(back.is_some(), "{} of 8 back\n{}", routes(&v4(&bgp)).len(), v4(&bgp));
    // A reader that is gone before the first line (`| head` that ended).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["upstream", "list", "--socket"])
        .arg(&socket)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&o.status), Some(libc::SIGPIPE), "{:?} {err}", o.status);
    // Nothing refused ever reached the speaker.
    assert!(!bgp.exabgp_log().contains("198.51.100."));
}

/// The block of docs/upstream.md after the marker that names this test.
fn documented_start() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/upstream.md")).unwrap();
    let at = doc.find("tests/tests/daemon/adversarial/upstream.rs runs this block as written").expect("the marker");
    let block = &doc[at..];
    let start = block.find("```sh\n").unwrap() + "```sh\n".len();
    block[start..start + block[start..].find("```").unwrap()].to_owned()
}

#[test]
fn the_documented_exabgp_start_works_as_written() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let Bed { mut bgp, net, socket, policy, _dir } = bed("u9", "198.18.40.0/24", "");
    // The harness's own ExaBGP (root, no drop) goes; the documented start
    // takes its place, with Debian's environment file as installed. Only
    // the pipes' name and the configuration's path are this test's.
    bgp.kill_exabgp();
    let gone = bgp.wait(SESSION, |b| !b.birdc("show protocols speaker").contains("Established"));
    assert!(gone, "the harness's session did not end");
    let name = format!("limiter-doc-{}", std::process::id());
    let conf = bgp.dir.0.join("exabgp.conf");
    let script = documented_start()
        .replace("limiter.in", &format!("{name}.in"))
        .replace("limiter.out", &format!("{name}.out"))
        .replace("pipename=limiter", &format!("pipename={name}"))
        .replace("/etc/exabgp/exabgp.conf", &conf.display().to_string());
    assert!(script.contains("--env /etc/exabgp/exabgp.env"), "{script}");
    println!("{script}");
    let pipe = std::path::Path::new("/run/exabgp").join(&name);
    for ext in ["in", "out"] {
        let _ = std::fs::remove_file(pipe.with_extension(ext));
    }
    let log = std::fs::File::create(bgp.dir.0.join("documented.log")).unwrap();
    let mut speaker = bgp
        .speaker_ns
        .net_command("sh")
        .args(["-ec", &script])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap();
    let text = std::fs::read_to_string(&policy).unwrap().replace(&bgp.pipe.display().to_string(), &pipe.display().to_string());
    std::fs::write(&policy, text).unwrap();
    let _daemon = run(&net, &policy, &socket);
    let up = bgp.wait_established(SESSION);
    let said = || std::fs::read_to_string(bgp.dir.0.join("documented.log")).unwrap_or_default();
    assert!(up, "no session with the documented start\n{}", said());
    ok(&scenario::cli(&socket, &["upstream", "announce", "198.18.99.0/24", "--ttl", "1h"]));
    let seen = until(&bgp, Duration::from_secs(15), |b| v4(b).contains("src 198.18.99.0/24"));
    // ExaBGP dropped to its user (Debian's environment says so).
    let conf_path = conf.display().to_string();
    let dropped = std::process::Command::new("pgrep").args(["-u", "exabgp", "-f", &conf_path]).output().unwrap();
    println!("ExaBGP as the user exabgp: pids {:?}", String::from_utf8_lossy(&dropped.stdout).split_whitespace().collect::<Vec<_>>());
    // SAFETY: kill(2) of the group our own child leads.
    unsafe { libc::kill(-i32::try_from(speaker.id()).unwrap(), libc::SIGKILL) };
    let _ = speaker.wait();
    for ext in ["in", "out"] {
        let _ = std::fs::remove_file(pipe.with_extension(ext));
    }
    assert!(seen.is_some(), "the rule did not reach the router\n{}\n{}", v4(&bgp), said());
    assert!(dropped.status.success(), "ExaBGP did not drop to its user\n{}", said());
}
