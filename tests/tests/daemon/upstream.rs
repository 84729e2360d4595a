//! Rules announced upstream through a real speaker to a real router: the
//! daemon (`limiter run` on a veth) drives ExaBGP through its command
//! pipes; ExaBGP peers with BIRD 2, the transit's router, over a veth of
//! their own; what the transit sees is read from BIRD's own tables
//! (`birdc show route table flowtab4|flowtab6 all`).
//!
//! - The operator's `prefix deny --upstream` reaches BIRD's flow4 table
//!   as a FlowSpec discard of the source and leaves it when its TTL ends;
//!   an IPv6 rate-limit reaches flow6; a protected network (upstream.never,
//!   or an allow) and one wider than the policy's widths are refused and
//!   never reach BIRD (a `prefix deny --upstream` of one is refused whole:
//!   not denied here either); a blackhole only once the policy allows it.
//! - ExaBGP killed and started again: the daemon finds it without its
//!   routes and gives them again, each once; the daemon restarted: its
//!   rules are taken up from the state file, nothing duplicated or lost.
//! - Link pressure (a low `link_capacity`): a flood from three /24s has the
//!   two unprotected ones announced rate-limited while it lasts and
//!   withdrawn after the hold-down, the protected one never.

use std::{
    path::{Path, PathBuf},
    process::Output,
    time::{Duration, Instant},
};

use limiter_tests::{
    bgp::{Bgp, routes},
    kernel::{TempDir, require_root},
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, PORT, spawn_lines, unique_socket, wait_for},
};

pub(crate) const SESSION: Duration = Duration::from_mins(1);

pub(crate) fn run(net: &VethPair, policy: &Path, socket: &Path) -> (scenario::Guard, std::sync::mpsc::Receiver<String>) {
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"]).arg(policy);
    c.arg("--socket").arg(socket);
    let (g, log) = spawn_lines(c).unwrap();
    wait_for(&log, "control socket", Duration::from_secs(30), &mut String::new()).unwrap();
    (g, log)
}

pub(crate) fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn refused(o: &Output) -> String {
    assert!(!o.status.success(), "accepted: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn list(socket: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&scenario::cli(socket, &["upstream", "list", "-j"]))).unwrap()
}

/// The policy: an allowed /24 (198.18.41), `never` the network given.
fn policy(dir: &Path, bgp: &Bgp, never: &str, extra: &str) -> PathBuf {
    let path = dir.join("upstream.toml");
    let text = format!(
        "rate = 1000\nburst = 1000\n\n[[override]]\ncidr = \"198.18.41.0/24\"\naction = \"allow\"\n\n[upstream]\nspeaker \
         = {:?}\nstate = {:?}\nnever = [\"{never}\"]\nmax_changes_per_minute = 600\n{extra}",
        bgp.pipe.display().to_string(),
        dir.join("upstream.json").display().to_string()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A test's router and speaker, its veth for the daemon, and the policy
/// written (`never` and `extra` as [`policy`] takes them).
pub(crate) struct Bed {
    pub(crate) bgp: Bgp,
    pub(crate) net: VethPair,
    pub(crate) socket: PathBuf,
    pub(crate) policy: PathBuf,
    pub(crate) _dir: TempDir,
}

pub(crate) fn bed(tag: &str, never: &str, extra: &str) -> Bed {
    let bgp = Bgp::start(tag);
    let net = VethPair::new(&format!("{tag}d"));
    let dir = TempDir::new(&format!("upstream-{tag}"));
    let policy = policy(&dir.0, &bgp, never, extra);
    Bed { bgp, net, socket: unique_socket(tag), policy, _dir: dir }
}

/// How long `cond` took to hold (polling BIRD), within `within`.
pub(crate) fn until(bgp: &Bgp, within: Duration, cond: impl Fn(&Bgp) -> bool) -> Option<Duration> {
    let start = Instant::now();
    bgp.wait(within, cond).then(|| start.elapsed())
}

#[test]
#[expect(clippy::too_many_lines, reason = "one router through every step: each step starts from the state the last left")]
fn the_operators_rules_reach_the_router_and_leave_it_and_survive_restarts() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let Bed { mut bgp, net, socket, policy, _dir } = bed("up", "198.18.40.0/24", "communities = [\"64500:100\"]\n");
    let daemon = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());

    // The operator's deny, upstream too, for 4 s.
    let asked = Instant::now();
    ok(&scenario::cli(&socket, &["prefix", "deny", "198.18.80.0/24", "--upstream", "--ttl", "4s"]));
    let v4 = |b: &Bgp| b.flows(false);
    assert!(
        until(&bgp, Duration::from_secs(10), |b| v4(b).contains("src 198.18.80.0/24")).is_some(),
        "not in flow4\n{}\n{}",
        v4(&bgp),
        bgp.exabgp_log()
    );
    let table = v4(&bgp);
    println!("deny --upstream in BIRD's flow4 {} ms after the command began:\n{table}", asked.elapsed().as_millis());
    assert_eq!(routes(&table), ["flow4 { src 198.18.80.0/24; }"], "{table}");
    // The action: traffic-rate 0, which is discard (RFC 8955); the
    // policy's community.
    assert!(table.contains("(generic, 0x80060000, 0x0)"), "{table}");
    assert!(table.contains("BGP.community: (64500,100)"), "{table}");
    // Denied here as well.
    assert!(ok(&scenario::cli(&socket, &["prefix", "list"])).contains("198.18.80.0/24"));

    // IPv6, rate-limited to 1,000 bytes/s (the float 1000.0 is 0x447a0000).
    ok(&scenario::cli(&socket, &["upstream", "announce", "2001:2:80::/48", "--rate-limit", "1000", "--ttl", "1h"]));
    let v6 = |b: &Bgp| b.flows(true);
    assert!(until(&bgp, Duration::from_secs(10), |b| v6(b).contains("src 2001:2:80::/48")).is_some(), "{}", v6(&bgp));
    assert!(v6(&bgp).contains("(generic, 0x80060000, 0x447a0000)"), "{}", v6(&bgp));

    // Protected and too wide: refused, with why.
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.18.41.128/25"]));
    assert!(e.contains("198.18.41.0/24") && e.contains("never announced"), "{e}");
    // `prefix deny --upstream` is one change: refused whole, not denied here either.
    let e = refused(&scenario::cli(&socket, &["prefix", "deny", "198.18.40.0/24", "--upstream"]));
    assert!(e.contains("never announced") && e.contains("nothing changed"), "{e}");
    assert!(!ok(&scenario::cli(&socket, &["prefix", "list"])).contains("198.18.40.0/24"), "denied though refused");
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.18.0.0/16"]));
    assert!(e.contains("wider than /24"), "{e}");
    // A blackhole is the operator's, and only where the policy allows it.
    let e = refused(&scenario::cli(&socket, &["upstream", "blackhole", "198.18.90.1/32"]));
    assert!(e.contains("rtbh = false"), "{e}");
    // The audit trail has the operator's announcements, and the refusals
    // with why.
    let trail: serde_json::Value = serde_json::from_str(&ok(&scenario::cli(&socket, &["history", "-j"]))).unwrap();
    let records = trail["records"].as_array().unwrap();
    let of = |change: &str| records.iter().find(|r| r["change"] == change).cloned();
    let announced = of("upstream announce 2001:2:80::/48 ttl 3600").unwrap_or_else(|| panic!("{trail}"));
    assert!(announced["by"].as_str().unwrap().starts_with("uid 0 pid ") && announced["ok"] == true, "{announced}");
    let wide = of("upstream announce 198.18.0.0/16").unwrap_or_else(|| panic!("{trail}"));
    assert!(wide["ok"] == false && wide["result"].as_str().unwrap().contains("wider than /24"), "{wide}");

    // The TTL ends: withdrawn from the router.
    let gone = until(&bgp, Duration::from_secs(15), |b| !v4(b).contains("198.18.80.0/24"))
        .unwrap_or_else(|| panic!("not withdrawn\n{}", v4(&bgp)));
    println!("withdrawn {} ms after it was asked for (ttl 4 s)", (asked.elapsed()).as_millis());
    // Whole seconds: asked for at t.9 of a second, due at t + 4.
    assert!(asked.elapsed() >= Duration::from_secs(3), "withdrawn before its ttl ({gone:?} into the wait)");
    assert!(list(&socket)["rules"].as_array().unwrap().iter().all(|r| r["net"] != "198.18.80.0/24"));

    // ExaBGP dies (no withdrawal: BIRD drops its routes with the session)
    // and comes back empty: the daemon gives it its rules again, once.
    ok(&scenario::cli(&socket, &["upstream", "announce", "198.18.81.0/24", "--ttl", "1h"]));
    assert!(until(&bgp, Duration::from_secs(10), |b| v4(b).contains("198.18.81.0/24")).is_some());
    bgp.kill_exabgp();
    assert!(until(&bgp, Duration::from_secs(30), |b| !v4(b).contains("198.18.81.0/24")).is_some(), "{}", v4(&bgp));
    let down = until(&bgp, Duration::from_secs(10), |_| list(&socket)["status"]["speaker_up"] == false);
    assert!(down.is_some(), "the daemon did not see the speaker go");
    let status = ok(&scenario::cli(&socket, &["status"]));
    assert!(status.contains("upstream") && status.contains("DOWN"), "{status}");
    // With the speaker down the operator's deny is in force at once and
    // its rule waits.
    ok(&scenario::cli(&socket, &["prefix", "deny", "198.18.84.0/24", "--upstream", "--ttl", "1h"]));
    assert!(ok(&scenario::cli(&socket, &["prefix", "list"])).contains("198.18.84.0/24"));
    let l = list(&socket);
    assert!(l["status"]["pending"].as_u64().unwrap() >= 1, "{l}");
    bgp.start_exabgp();
    assert!(bgp.wait_established(SESSION), "no session again\n{}", bgp.exabgp_log());
    let back = until(&bgp, Duration::from_secs(20), |b| {
        v4(b).contains("198.18.81.0/24") && v4(b).contains("198.18.84.0/24") && v6(b).contains("2001:2:80::/48")
    });
    assert!(back.is_some(), "not announced again\n{}\n{}", v4(&bgp), v6(&bgp));
    std::thread::sleep(Duration::from_secs(2));
    let mut v4_routes = routes(&v4(&bgp));
    v4_routes.sort();
    assert_eq!(v4_routes, ["flow4 { src 198.18.81.0/24; }", "flow4 { src 198.18.84.0/24; }"], "{}", v4(&bgp));
    assert_eq!(routes(&v6(&bgp)), ["flow6 { src 2001:2:80::/48; }"], "{}", v6(&bgp));
    let l = list(&socket);
    assert!(l["status"]["reannounced"].as_u64().unwrap() >= 1, "{l}");
    println!("after ExaBGP's restart: {}", l["status"]);

    // The daemon stops (withdraw_on_stop = false: the rules stay with the
    // speaker) and starts again: its rules come from the state file, the
    // router's table unchanged.
    drop(daemon);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(routes(&v4(&bgp)).len(), 2, "{}", v4(&bgp));
    let daemon = run(&net, &policy, &socket);
    let l = until(&bgp, Duration::from_secs(10), |_| list(&socket)["status"]["speaker_up"] == true);
    assert!(l.is_some());
    std::thread::sleep(Duration::from_secs(2));
    let l = list(&socket);
    let nets: Vec<&str> = l["rules"].as_array().unwrap().iter().map(|r| r["net"].as_str().unwrap()).collect();
    assert_eq!(nets, ["198.18.81.0/24", "198.18.84.0/24", "2001:2:80::/48"], "{l}");
    assert_eq!(l["status"]["announcements"], 0, "announced again: {l}");
    assert_eq!(routes(&v4(&bgp)).len(), 2, "{}", v4(&bgp));
    assert_eq!(routes(&v6(&bgp)), ["flow6 { src 2001:2:80::/48; }"]);

    // The policy allows blackholing: the operator's blackhole reaches the
    // router's unicast table with the BLACKHOLE community.
    // A new community is given to the routes already announced.
    let text = std::fs::read_to_string(&policy).unwrap().replace("64500:100", "64500:200") + "rtbh = true\n";
    std::fs::write(&policy, text).unwrap();
    ok(&scenario::cli(&socket, &["policy", "apply"]));
    // Both families' routes, each sent in its own update: the IPv6 one
    // may reach the router after the IPv4 ones.
    let renewed = until(&bgp, Duration::from_secs(10), |b| {
        let t = v4(b);
        let six = v6(b);
        t.matches("BGP.community: (64500,200)").count() == 2
            && !t.contains("(64500,100)")
            && six.contains("BGP.community: (64500,200)")
            && !six.contains("(64500,100)")
    });
    assert!(renewed.is_some(), "the routes keep the old community\n{}\n{}", v4(&bgp), v6(&bgp));
    ok(&scenario::cli(&socket, &["upstream", "blackhole", "198.18.90.1/32", "--ttl", "1h"]));
    let bh = until(&bgp, Duration::from_secs(10), |b| b.birdc("show route all 198.18.90.1/32").contains("(65535,666)"));
    assert!(bh.is_some(), "{}", bgp.birdc("show route all"));

    // Everything withdrawn.
    ok(&scenario::cli(&socket, &["upstream", "withdraw", "--all"]));
    let empty = until(&bgp, Duration::from_secs(10), |b| {
        routes(&v4(b)).is_empty() && routes(&v6(b)).is_empty() && !b.birdc("show route all").contains("198.18.90.1")
    });
    assert!(empty.is_some(), "{}\n{}", v4(&bgp), v6(&bgp));
    // With `withdraw_on_stop`, a daemon that stops takes its rules with it.
    let text = std::fs::read_to_string(&policy).unwrap() + "withdraw_on_stop = true\n";
    std::fs::write(&policy, text).unwrap();
    ok(&scenario::cli(&socket, &["policy", "apply"]));
    ok(&scenario::cli(&socket, &["upstream", "announce", "198.18.82.0/24", "--protocol", "udp"]));
    assert!(until(&bgp, Duration::from_secs(10), |b| v4(b).contains("src 198.18.82.0/24; proto 17;")).is_some(), "{}", v4(&bgp));
    drop(daemon);
    assert!(routes(&v4(&bgp)).is_empty(), "left announced after the stop\n{}", v4(&bgp));
    // Never, at any point, a protected network.
    let log = bgp.exabgp_log();
    assert!(!log.contains("198.18.40.") && !log.contains("198.18.41."), "{log}");
}

/// Shadow mode logs and sends nothing; the change budget holds what is
/// past it; the cap refuses the operator's rule past it.
#[test]
fn shadow_mode_sends_nothing_and_the_change_budget_holds_the_rest() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let Bed { bgp, net, socket, policy, _dir } = bed("sh", "198.18.40.0/24", "shadow = true\n");
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace("max_changes_per_minute = 600", "max_changes_per_minute = 3\nmax_rules = 4");
    std::fs::write(&policy, &text).unwrap();
    let (_daemon, log) = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());
    let v4 = |b: &Bgp| b.flows(false);
    for n in 85..=86 {
        ok(&scenario::cli(&socket, &["upstream", "announce", &format!("198.18.{n}.0/24")]));
    }
    let mut lines = String::new();
    let _ = wait_for(&log, "shadow: would announce upstream flowspec source 198.18.86.0/24", Duration::from_secs(5), &mut lines);
    assert!(lines.contains("would announce upstream flowspec source 198.18.85.0/24 discard"), "{lines}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(routes(&v4(&bgp)).is_empty(), "shadow mode announced\n{}", v4(&bgp));
    assert_eq!(list(&socket)["status"]["announced"], 0);

    // Out of shadow, with 3 changes a minute: two rules, then two more of
    // which one waits.
    std::fs::write(&policy, text.replace("shadow = true\n", "")).unwrap();
    ok(&scenario::cli(&socket, &["policy", "apply"]));
    assert!(until(&bgp, Duration::from_secs(10), |b| routes(&v4(b)).len() == 2).is_some(), "{}", v4(&bgp));
    for n in 87..=88 {
        ok(&scenario::cli(&socket, &["upstream", "announce", &format!("198.18.{n}.0/24")]));
    }
    std::thread::sleep(Duration::from_secs(3));
    let l = list(&socket);
    assert_eq!(routes(&v4(&bgp)).len(), 3, "past the budget\n{}", v4(&bgp));
    assert_eq!((l["rules"].as_array().unwrap().len(), l["status"]["pending"].as_u64()), (4, Some(1)), "{l}");
    assert_eq!(l["status"]["announced"], 3, "{l}");
    // At `max_rules`, the operator's next rule is refused, and says why.
    let e = refused(&scenario::cli(&socket, &["upstream", "announce", "198.18.89.0/24"]));
    assert!(e.contains("max_rules"), "{e}");
}

#[test]
fn link_pressure_announces_the_flooding_prefixes_and_withdraws_them_after() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    // 2 Mbit/s of link, pressure over half of it for 2 s; the flood below
    // sends about 30 Mbit/s.
    let extra = "link_capacity = 2000000\npressure_percent = 50\npressure_sustained = \"2s\"\nhold_down = \
                 \"3s\"\npressure_prefixes = 3\n";
    let Bed { bgp, net, socket, policy, _dir } = bed("lp", "198.18.12.0/24", extra);
    let _daemon = run(&net, &policy, &socket);
    assert!(bgp.wait_established(SESSION), "no session\n{}", bgp.exabgp_log());

    let netload = env!("CARGO_BIN_EXE_netload");
    let (mac, dst) = (net.b_mac(), format!("{B_ADDR}:{PORT}"));
    let secs = 8.0;
    let floods: Vec<_> = ["198.18.10", "198.18.11", "198.18.12"]
        .into_iter()
        .map(|prefix| {
            let mut f = net.a.command(netload);
            f.args(["spoof-prefix", "va", &mac, &dst, prefix, "20000", &secs.to_string()]);
            f.stdout(std::process::Stdio::piped()).spawn().unwrap()
        })
        .collect();
    let v4 = |b: &Bgp| b.flows(false);
    let both = |b: &Bgp| v4(b).contains("src 198.18.10.0/24") && v4(b).contains("src 198.18.11.0/24");
    let seen = until(&bgp, Duration::from_secs_f64(secs + 2.0), both);
    let during = v4(&bgp);
    let l = list(&socket);
    let ended: Vec<Output> = floods.into_iter().map(|f| f.wait_with_output().unwrap()).collect();
    let flood_end = Instant::now();
    for o in &ended {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    println!("under pressure after {seen:?}: {}\n{during}", l["pressure"]);
    assert!(seen.is_some(), "the flooding /24s were not announced\n{during}\n{l}");
    // Rate-limited to what the class admits of each: 1,000 packets/s of
    // 1,500 bytes at most (the float 1.5e6 is 0x49b71b00).
    assert!(during.contains("(generic, 0x80060000, 0x49b71b00)"), "{during}");
    assert!(!during.contains("198.18.12."), "a protected prefix was announced\n{during}");
    assert!(l["rules"].as_array().unwrap().iter().all(|r| r["by"] == "pressure"), "{l}");

    // The flood ends: withdrawn after the hold-down (3 s from the last
    // second each was among the droppers).
    let gone = until(&bgp, Duration::from_secs(30), |b| routes(&v4(b)).is_empty());
    println!("withdrawn {:?} after the flood ended", flood_end.elapsed());
    assert!(gone.is_some(), "{}", v4(&bgp));
    assert!(flood_end.elapsed() >= Duration::from_secs(2), "withdrawn before the hold-down");
    assert!(!bgp.exabgp_log().contains("198.18.12."));

    // The audit trail has each announcement and withdrawal, by pressure.
    std::thread::sleep(Duration::from_millis(1_500));
    let trail: serde_json::Value = serde_json::from_str(&ok(&scenario::cli(&socket, &["history", "-j"]))).unwrap();
    let changes: Vec<(String, String)> = trail["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["by"].as_str().unwrap().to_owned(), r["change"].as_str().unwrap().to_owned()))
        .collect();
    for prefix in ["198.18.10.0/24", "198.18.11.0/24"] {
        for verb in ["announce", "withdraw"] {
            let found = changes.iter().any(|(by, c)| by == "pressure" && c.starts_with(&format!("upstream {verb} ")) && c.contains(prefix));
            assert!(found, "no {verb} of {prefix} by pressure in the trail: {changes:#?}");
        }
    }
}
