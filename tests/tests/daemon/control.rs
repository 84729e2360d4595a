//! The control socket and every operator verb against a running daemon,
//! in human and JSON form, plus peer-credential checks.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::Duration,
};

use limiter_tests::{
    kernel::require_root,
    netns::{B_IF, VethPair},
    scenario::{self, FLOOD_SRC, Guard, spawn_lines, unique_socket, wait_for},
};

struct Running {
    net: VethPair,
    daemon: Guard,
    /// Keeps reading the daemon's output.
    _log: std::sync::mpsc::Receiver<String>,
    socket: PathBuf,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        // The daemon's Guard stops it (SIGTERM, so it removes its socket).
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(tag: &str, extra: &[&str]) -> Running {
    require_root();
    let dir = std::env::temp_dir().join(format!("limiter-ctl-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "rate = 1000\nburst = 200\n\n[[override]]\ncidr = \"198.18.9.0/24\"\naction = \"allow\"\n")
        .unwrap();
    let net = VethPair::new(tag);
    net.add_source(FLOOD_SRC);
    let socket = unique_socket(tag);
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(&policy).arg("--socket").arg(&socket);
    c.args(extra);
    let (daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();
    Running { net, daemon, _log: rx, socket, dir }
}

fn cli(socket: &Path, args: &[&str]) -> Output {
    Command::new(scenario::locate_bin("limiter").unwrap()).args(args).arg("--socket").arg(socket).output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status, String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).expect("one JSON document")
}

/// Every row of the table starting at `text`'s first line has a cell
/// starting exactly under each of `columns` (left-aligned headers).
fn aligned(text: &str, columns: &[&str]) {
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    for col in columns {
        let at = header.find(col).unwrap_or_else(|| panic!("{col} not in {header:?}"));
        for row in lines.clone().take_while(|l| !l.is_empty() && !l.starts_with('(')) {
            let starts = row.get(at..).is_some_and(|r| !r.starts_with(' ')) && row[..at].ends_with(' ');
            assert!(starts, "{col:?} (at {at}) is not where a cell of {row:?} starts:\n{text}");
        }
    }
}

/// Colour only when asked (or on a terminal without `NO_COLOR`: unit
/// tests), never in JSON; a coloured table lines up as the plain one
/// (`plain`: `stats --all` into a pipe).
fn colour_only_when_asked(s: &Path, plain: &str) {
    assert!(!plain.contains('\x1b'), "colour into a pipe: {plain}");
    let coloured = ok(&cli(s, &["stats", "--all", "--color", "always"]));
    assert!(coloured.contains("\x1b[31mdrop\x1b[0m") && coloured.contains("\x1b[32mpass\x1b[0m"), "{coloured:?}");
    let stripped = ["\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"].iter().fold(coloured, |t, c| t.replace(c, ""));
    assert_eq!(stripped, plain);
    assert!(!ok(&cli(s, &["stats", "-j", "--color", "always"])).contains('\x1b'));
    assert!(!ok(&cli(s, &["stats", "--all", "--color", "never"])).contains('\x1b'));
}

fn one_error_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// Send `n` UDP packets from FLOOD_SRC in a second; how many arrived.
fn delivered(r: &Running, n: u64) -> u64 {
    scenario::delivered(&r.net, FLOOD_SRC, n)
}

#[test]
fn every_verb_in_human_and_json_form() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("vb", &[]);
    let s = &r.socket;
    let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode {mode:o}");

    let out = ok(&cli(s, &["status"]));
    assert!(out.contains("interface       vb (native)") && out.contains("policy          v1 from"), "{out}");
    let j = json(&cli(s, &["status", "--json"]));
    assert_eq!((j["iface"].as_str(), j["policy_version"].as_u64()), (Some("vb"), Some(1)), "{j}");
    // --watch asks again until interrupted: into a pipe, one view after
    // another, no screen codes.
    let mut watch = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["status", "--watch", "0.2", "--socket"])
        .arg(s)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_secs(2));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let views = String::from_utf8_lossy(&out.stdout);
    // Again and again, but not faster than asked (2 s at 0.2 s: 11 at most).
    let seen = views.lines().filter(|l| l.starts_with("interface ")).count();
    assert!((2..=11).contains(&seen), "{seen} views in 2 s at 0.2 s: {views}");
    assert!(!views.contains('\x1b'), "{views}");
    assert_eq!(cli(s, &["stats", "--watch", "0"]).status.code(), Some(2), "a watch of 0 s is refused");

    // Nothing counted yet: no reason row but the note; --all shows every
    // reason with the metrics' action words.
    let out = ok(&cli(s, &["stats"]));
    assert!(!out.contains("rate_limited") && out.contains("default"), "{out}");
    assert!(out.lines().any(|l| l.starts_with('(') && l.ends_with("reasons at zero not shown; --all shows them)")), "{out}");
    let out = ok(&cli(s, &["stats", "--all"]));
    aligned(&out, &["action"]);
    let row = |reason: &str| {
        out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|w| w.first() == Some(&reason))
    };
    assert_eq!(row("rate_limited").unwrap()[1], "drop", "{out}");
    assert_eq!(row("shadow_dropped").unwrap()[1], "shadow_drop", "{out}");
    colour_only_when_asked(s, &out);
    let j = json(&cli(s, &["stats", "-j"]));
    let reasons = j["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), limiter_common::REASON_COUNT, "{j}");
    for r in reasons {
        let reason: limiter_common::Reason =
            limiter_common::Reason::ALL.into_iter().find(|x| x.label() == r["reason"]).unwrap();
        assert_eq!(r["action"], reason.action().label(), "{r}");
    }

    let out = ok(&cli(s, &["policy", "show"]));
    assert!(out.starts_with("# policy v1") && out.contains("cidr = \"198.18.9.0/24\""), "{out}");
    let j = json(&cli(s, &["policy", "show", "--json"]));
    assert!(j["policy"].as_str().unwrap().contains("rate = 1000"), "{j}");

    // Runtime overrides: each change is a version, visible in list.
    let out = ok(&cli(s, &["prefix", "set", "198.18.0.0/16", "--rate", "50", "--burst", "60"]));
    assert!(out.contains("policy v2"), "{out}");
    let out = ok(&cli(s, &["prefix", "list"]));
    assert!(out.contains("198.18.0.0/16") && out.contains("runtime") && out.contains("198.18.9.0/24"), "{out}");
    aligned(&out, &["action", "origin"]);
    let j = json(&cli(s, &["prefix", "deny", "198.18.1.0/24", "-j"]));
    assert_eq!(j["version"].as_u64(), Some(3), "{j}");
    let j = json(&cli(s, &["prefix", "list", "-j"]));
    let entries = j["overrides"].as_array().unwrap();
    assert_eq!(entries.len(), 3, "{j}");
    assert!(entries.iter().any(|e| e["cidr"] == "198.18.1.0/24" && e["action"] == "deny" && e["origin"] == "runtime"));

    // The data plane follows: denied, then allowed once unset.
    assert_eq!(delivered(&r, 50), 0, "deny did not take effect");
    ok(&cli(s, &["prefix", "unset", "198.18.1.0/24"]));
    assert_eq!(delivered(&r, 40), 40, "unset did not take effect (the /16 allows 60)");
    ok(&cli(s, &["prefix", "allow", "198.18.2.0/24", "--json"]));

    // Bad input: one line, non-zero, nothing changes.
    let err = one_error_line(&cli(s, &["prefix", "set", "198.18.1.7/24", "--rate", "1", "--burst", "1"]));
    // Named as typed, not as the override's index in the policy it would
    // have made.
    assert!(err.contains("198.18.1.7/24 has host bits set (did you mean 198.18.1.0/24?)"), "{err}");
    assert!(!err.contains("override["), "{err}");
    // A bare address is its /32, as in prefix show: refused for what it
    // is, finer than a bucket.
    let err = one_error_line(&cli(s, &["prefix", "deny", "198.18.1.7"]));
    assert!(err.contains("198.18.1.7/32 is longer than the bucket prefix /24"), "{err}");
    // Not a CIDR is a bad argument: refused before the daemon is asked
    // (exit status 2, as every usage error).
    let o = cli(s, &["prefix", "deny", "not-a-cidr"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.lines().count() == 1 && err.contains("not-a-cidr"), "{err}");
    one_error_line(&cli(s, &["prefix", "unset", "203.0.113.0/24"]));
    // Refused requests are not reloads: the file's health stays, and each
    // counts under its verb.
    let j = json(&cli(s, &["status", "-j"]));
    assert!(j["last_reload"].is_null() || j["last_reload"]["ok"].as_bool() == Some(true), "{j}");
    let text = scenario::scrape(&r.net);
    for (series, n) in [
        ("limiter_policy_reloads_total{result=\"failure\"}", 0),
        ("limiter_control_refused_total{verb=\"prefix_set\"}", 1),
        ("limiter_control_refused_total{verb=\"prefix_unset\"}", 1),
        ("limiter_control_refused_total{verb=\"prefix_deny\"}", 1),
        ("limiter_control_refused_total{verb=\"prefix_allow\"}", 0),
    ] {
        assert_eq!(scenario::metric(&text, series), n, "{series} in\n{text}");
    }
    let bad = r.dir.join("bad.toml");
    std::fs::write(&bad, "rate = 100\nburst = 0\n").unwrap();
    let err = one_error_line(&cli(s, &["policy", "apply", bad.to_str().unwrap()]));
    assert!(err.contains(&format!("{}:2: burst:", bad.display())) && err.contains("keeps running"), "{err}");
    let j = json(&cli(s, &["status", "-j"]));
    assert_eq!(j["policy_version"].as_u64(), Some(5), "{j}");
    assert_eq!(j["last_reload"]["ok"].as_bool(), Some(false), "{j}");
    assert_eq!(scenario::metric(&scenario::scrape(&r.net), "limiter_policy_reloads_total{result=\"failure\"}"), 1);

    // A good file applies as the next version, runtime overrides kept.
    let good = r.dir.join("good.toml");
    std::fs::write(&good, "rate = 3000\nburst = 300\n").unwrap();
    let out = ok(&cli(s, &["policy", "apply", good.to_str().unwrap()]));
    assert!(out.contains("policy v6: rate 3000") && out.contains("overrides"), "{out}");
    // Without FILE the daemon re-reads its own source (--policy).
    let j = json(&cli(s, &["policy", "apply", "--json"]));
    assert_eq!(j["version"].as_u64(), Some(7), "{j}");
    assert!(j["summary"].as_str().unwrap().contains("rate 1000"), "{j}");
}

#[test]
fn peers_that_are_not_root_or_in_the_group_are_refused() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("pc", &["--socket-group", "4242"]);
    let s = &r.socket;
    // Open the file mode wide so only the daemon's own check stands.
    std::fs::set_permissions(s, std::fs::Permissions::from_mode(0o666)).unwrap();
    let as_user = |gid: &str| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", gid, "--clear-groups"])
            .arg(scenario::locate_bin("limiter").unwrap())
            .args(["status", "--json", "--socket"])
            .arg(s)
            .output()
            .unwrap()
    };
    // Refused: under --json, the error is the JSON answer (exit 1).
    let o = as_user("65534");
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let err = err["error"].as_str().unwrap_or_default();
    assert!(err.contains("permission denied: uid 65534 is not root and not in group 4242"), "{err}");
    let j = json(&as_user("4242"));
    assert_eq!(j["policy_version"].as_u64(), Some(1), "{j}");
    thread::sleep(Duration::from_millis(10));
}

fn tcp_listeners(r: &Running) -> Vec<String> {
    let pid = r.daemon.0.id();
    // The daemon runs in the receiver namespace; list its sockets there.
    let ss = Command::new("ip").args(["netns", "exec", &r.net.b.name, "ss", "-Htlnp"]).output().unwrap();
    String::from_utf8_lossy(&ss.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_tcp_control_listener_is_opened() {
    let _alone = limiter_tests::alone(module_path!());
    // With metrics off: no TCP listener at all.
    let r = start("nt", &["--metrics", "off"]);
    assert_eq!(tcp_listeners(&r), Vec::<String>::new());
    drop(r);
    // By default the one TCP listener is the read-only /metrics on loopback.
    let r = start("nm", &[]);
    let l = tcp_listeners(&r);
    assert_eq!(l.len(), 1, "{l:?}");
    assert!(l[0].contains("127.0.0.1:9464"), "{l:?}");
}

#[test]
fn completions_and_man_page_come_from_the_cli_definition() {
    let _alone = limiter_tests::alone(module_path!());
    let bin = scenario::locate_bin("limiter").unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let o = Command::new(&bin).args(["completions", shell]).output().unwrap();
        let text = ok(&o);
        assert!(text.contains("prefix") && text.contains("policy"), "{shell}");
    }
    let man = ok(&Command::new(&bin).arg("man").output().unwrap());
    assert!(man.contains(".TH limiter") && man.contains("prefix"), "{}", &man[..200.min(man.len())]);
    // The pages are in section 8, and the help names them so.
    let th = man.lines().find(|l| l.starts_with(".TH")).unwrap_or_default();
    assert!(th.split_whitespace().nth(2) == Some("8"), "{th}");
    let help = ok(&Command::new(&bin).args(["man", "--help"]).output().unwrap());
    assert!(help.contains("limiter(8)") && !help.contains("(1)"), "{help}");
}

#[test]
fn the_daemon_survives_its_stdout_going_away() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("so");
    let socket = unique_socket("so");
    let mut child = net
        .b
        .command(scenario::locate_bin("limiter").unwrap())
        .args(["run", "--iface", B_IF, "--status-interval", "0.1", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end at once: every later line hits EPIPE.
    drop(child.stdout.take());
    let mut waited = 0;
    while !socket.exists() && waited < 200 {
        thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    let daemon = Guard(child);
    thread::sleep(Duration::from_millis(500)); // several status lines
    ok(&cli(&socket, &["prefix", "deny", "198.18.1.0/24"]));
    let j = json(&cli(&socket, &["status", "-j"]));
    assert_eq!(j["policy_version"].as_u64(), Some(2), "{j}");
    drop(daemon);
}

/// A penalty with a TTL drops its prefix in XDP at once and is lifted on
/// time, by the daemon, with no one to undo it.
#[test]
fn a_penalty_with_a_ttl_drops_the_prefix_until_it_expires() {
    let _alone = limiter_tests::alone(module_path!());
    let r = start("ttl", &[]);
    assert_eq!(delivered(&r, 50), 50);
    let o = cli(&r.socket, &["prefix", "deny", "198.18.1.0/24", "--ttl", "4s"]);
    ok(&o);
    let t0 = std::time::Instant::now();
    let j = json(&cli(&r.socket, &["prefix", "list", "--json"]));
    let entry = j["overrides"].as_array().unwrap().iter().find(|e| e["cidr"] == "198.18.1.0/24").unwrap().clone();
    assert!(entry["expires_in_secs"].as_u64().is_some_and(|s| s <= 4), "{entry}");
    assert_eq!(delivered(&r, 50), 0, "the penalty did not drop the prefix");
    // Lifted on time: gone from the list between 4 and 6 s after it was set.
    let lifted = loop {
        let j = json(&cli(&r.socket, &["prefix", "list", "--json"]));
        let present = j["overrides"].as_array().unwrap().iter().any(|e| e["cidr"] == "198.18.1.0/24");
        if !present || t0.elapsed() > Duration::from_secs(10) {
            break t0.elapsed();
        }
        thread::sleep(Duration::from_millis(100));
    };
    println!("a 4 s penalty was lifted {lifted:?} after it was set");
    assert!(lifted >= Duration::from_secs(3) && lifted <= Duration::from_secs(6), "{lifted:?}");
    assert_eq!(delivered(&r, 50), 50, "the prefix is still dropped after its penalty expired");
}

/// `prefix load --deny FILE`: 100,000 lines in one version, all or
/// nothing, and a bad line named by its number.
#[test]
fn a_bulk_load_applies_all_or_nothing_and_names_the_bad_line() {
    let _alone = limiter_tests::alone(module_path!());
    use std::fmt::Write as _;
    let r = start("bulk", &[]);
    let mut text = String::from("# a FireHOL-style netset\n\n");
    for i in 0..100_000u32 {
        let [_, a, b, c] = i.to_be_bytes();
        let _ = writeln!(text, "{}.{b}.{c}.0/24", 100 + a);
    }
    let file = r.dir.join("deny.netset");
    std::fs::write(&file, &text).unwrap();
    let start = std::time::Instant::now();
    let o = cli(&r.socket, &["prefix", "load", "--deny", file.to_str().unwrap()]);
    let took = start.elapsed();
    ok(&o);
    println!("prefix load of 100,000 lines: {took:?} (debug build)");
    let j = json(&cli(&r.socket, &["prefix", "list", "--json"]));
    assert_eq!(j["overrides"].as_array().unwrap().len(), 100_001, "100,000 plus the file's one");
    // A bad line: refused with its number, nothing changes.
    let bad = r.dir.join("bad.netset");
    std::fs::write(&bad, "# comment\n198.18.20.0/24\n\n198.18.21.7/24\n").unwrap();
    let o = cli(&r.socket, &["prefix", "load", "--deny", bad.to_str().unwrap()]);
    let err = one_error_line(&o);
    assert!(err.contains(&format!("{}:4: 198.18.21.7/24 has host bits set", bad.display())), "{err}");
    let j2 = json(&cli(&r.socket, &["prefix", "list", "--json"]));
    assert_eq!(j2["version"], j["version"], "a refused load made a version");
}
