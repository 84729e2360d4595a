//! The Debian package (`cargo xtask package`): it builds, lintian finds no
//! error in it, it holds what the README says, it installs, runs, removes
//! and purges cleanly on this machine, its maintainer scripts drive systemd
//! as they say, and an upgrade in place under a flood lets no packet of the
//! flood through unenforced and resets no bucket.
//!
//! Installing touches the machine (`/usr/sbin/limiter`, `/etc/limiter`):
//! the tests that do hold one lock, purge the package when they end, even
//! on failure, and refuse to start over a `limiter` package they did not
//! install.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
    thread,
    time::Duration,
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, CONFORM_SRC, Delivered, FLOOD_SRC, Guard, spawn_lines, wait_for},
};

mod harness;
use self::harness::*;

const RATE: u64 = 1000;
const BURST: u64 = 2000;
const SBIN: &str = "/usr/sbin/limiter";

#[test]
fn it_builds_and_lintian_finds_no_error() {
    let _alone = limiter_tests::alone(module_path!());
    let (deb, _) = debs();
    // Other test processes (nextest) may be rebuilding the package.
    let _lock = Lock::take();
    let o = Command::new("lintian").args(["--allow-root", "--fail-on", "error"]).arg(deb).output().expect("lintian");
    let report = String::from_utf8_lossy(&o.stdout);
    println!("lintian:\n{report}");
    assert!(o.status.success(), "lintian failed: {report}{}", String::from_utf8_lossy(&o.stderr));
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(field(deb, "Depends").contains("libc6"), "Depends: {}", field(deb, "Depends"));
}

/// Every verb and sub-verb the binary's help lists (`run`, `policy check`, ...).
fn verbs(bin: &Path, prefix: &[&str]) -> Vec<Vec<String>> {
    let help = stdout(Command::new(bin).args(prefix).arg("--help"));
    let listed: Vec<String> = help
        .split("Commands:\n")
        .nth(1)
        .map(|c| {
            c.lines()
                .take_while(|l| l.starts_with("  "))
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut all = Vec::new();
    for verb in listed.into_iter().filter(|v| v != "help") {
        let mut path: Vec<String> = prefix.iter().map(|s| (*s).to_owned()).collect();
        path.push(verb);
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        all.extend(verbs(bin, &refs));
        all.push(path);
    }
    all
}

#[test]
fn its_files_are_the_ones_the_readme_lists() {
    let _alone = limiter_tests::alone(module_path!());
    let (deb, _) = debs();
    // Other test processes (nextest) may be rebuilding the package.
    let _lock = Lock::take();
    let listing = stdout(Command::new("dpkg-deb").arg("-c").arg(deb));
    let files: BTreeSet<String> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_owned())
        .collect();
    let mut expected: BTreeSet<String> = [
        "/usr/sbin/limiter",
        "/lib/systemd/system/limiter@.service",
        "/etc/limiter/limiter.toml",
        "/usr/share/bash-completion/completions/limiter",
        "/usr/share/zsh/vendor-completions/_limiter",
        "/usr/share/fish/vendor_completions.d/limiter.fish",
        "/usr/share/limiter/grafana/limiter.json",
        "/usr/share/limiter/prometheus/limiter-alerts.yml",
        "/usr/share/doc/limiter/copyright",
        "/usr/share/doc/limiter/changelog.Debian.gz",
        "/usr/share/doc/limiter/README.md.gz",
        "/usr/share/doc/limiter/examples/forward.conf",
        "/usr/share/doc/limiter/examples/limiter.toml",
        "/usr/share/man/man8/limiter.8.gz",
        "/usr/share/man/man5/limiter.toml.5.gz",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    // The pages of docs/, beside the README.
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    for page in fs::read_dir(&docs).unwrap().map(|e| e.unwrap().path()) {
        if page.extension().is_some_and(|x| x == "md") {
            expected.insert(format!("/usr/share/doc/limiter/{}.gz", page.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(expected.contains("/usr/share/doc/limiter/policy.md.gz"), "{expected:?}");
    let bin = scenario::locate_bin("limiter").unwrap();
    let verbs = verbs(&bin, &[]);
    assert!(verbs.iter().any(|v| v == &["policy", "check"]), "{verbs:?}");
    for v in &verbs {
        expected.insert(format!("/usr/share/man/man8/limiter-{}.8.gz", v.join("-")));
    }
    assert_eq!(files, expected, "the package's files");
    assert!(
        listing.lines().any(|l| l.starts_with("-rwxr-xr-x root/root") && l.ends_with("./usr/sbin/limiter")),
        "{listing}"
    );

    let control = TempDir::new("deb-control");
    ok(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control.0));
    let conffiles = std::fs::read_to_string(control.0.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/limiter/limiter.toml");
    for s in ["postinst", "prerm", "postrm"] {
        assert!(control.0.join(s).is_file(), "{s} missing");
    }
    // The unit runs the packaged binary.
    let unit = std::fs::read_to_string(workspace().join("packaging/limiter@.service")).unwrap();
    assert!(unit.contains(&format!("ExecStart={SBIN} run ")), "{unit}");
}

/// One maintainer script, run directly as dpkg would, with `systemd`
/// booted or not: `/run/systemd/system` exists only in a private mount
/// namespace (a tmpfs on /run) when `booted`. `systemctl` is a stand-in
/// that records its arguments. Returns (exit success, systemctl calls).
fn script(dir: &Path, name: &str, args: &[&str], booted: bool) -> (bool, Vec<String>) {
    let fake = TempDir::new("fake-systemctl");
    let log = fake.0.join("calls");
    std::fs::write(fake.0.join("systemctl"), format!("#!/bin/sh\necho \"$*\" >> {}\n", log.display())).unwrap();
    ok(Command::new("chmod").arg("755").arg(fake.0.join("systemctl")));
    let path = format!("{}:{}", fake.0.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = if booted {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && exec \"$@\"")
            .args(["sh", "env"]);
        c
    } else {
        assert!(!Path::new("/run/systemd/system").exists(), "systemd runs here: the unbooted case cannot be checked");
        Command::new("env")
    };
    c.arg(format!("PATH={path}")).arg("sh").arg(dir.join(name)).args(args);
    let o = c.output().unwrap();
    if !o.status.success() {
        eprintln!("{name} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let calls = std::fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_owned).collect();
    (o.status.success(), calls)
}

/// PID 1 here is not systemd, so `systemctl` cannot run for real: each
/// script's calls are checked against a stand-in, in both worlds.
#[test]
fn maintainer_scripts_drive_systemd_as_they_say() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let (deb, _) = debs();
    let pid1 = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    println!("skipped: real systemctl calls (PID 1 is {}, not systemd); checked against a stand-in", pid1.trim());
    let control = TempDir::new("deb-scripts");
    ok(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control.0));
    let dir = &control.0;
    let reload = "--system daemon-reload";
    let cases: [(&str, &[&str], &[&str]); 7] = [
        ("postinst", &["configure", ""], &[reload]),
        ("postinst", &["configure", "0.1.0-1"], &[reload, "try-restart limiter@*.service"]),
        ("prerm", &["upgrade", "0.1.0-2"], &[]),
        ("prerm", &["remove"], &["stop limiter@*.service"]),
        ("postrm", &["remove"], &[reload]),
        ("postrm", &["upgrade", "0.1.0-2"], &[]),
        ("postinst", &["abort-upgrade", "0.1.0-2"], &[]),
    ];
    for (name, args, want) in cases {
        let (success, calls) = script(dir, name, args, true);
        assert!(success, "{name} {args:?} failed");
        assert_eq!(calls, want, "{name} {args:?} under systemd");
        let (success, calls) = script(dir, name, args, false);
        assert!(success && calls.is_empty(), "{name} {args:?} without systemd called {calls:?}");
    }
    let (success, _) = script(dir, "postinst", &["bogus"], true);
    assert!(!success, "an unknown action must fail");
    let group = Command::new("getent").args(["group", "limiter"]).output().unwrap();
    assert!(group.status.success(), "postinst configure made no limiter group");
}

#[test]
fn installed_it_runs_and_removes_cleanly() {
    let _alone = limiter_tests::alone(module_path!());
    let (deb, _) = debs();
    let installed = Installed::new(deb);
    let files: Vec<String> = stdout(Command::new("dpkg").args(["-L", "limiter"])).lines().map(str::to_owned).collect();

    let version = stdout(Command::new(SBIN).arg("--version"));
    let rev = stdout(Command::new("git").current_dir(workspace()).args(["rev-parse", "--short=12", "HEAD"]));
    println!("{}", version.trim());
    assert!(version.starts_with(&format!("limiter {} (git {}", env!("CARGO_PKG_VERSION"), rev.trim())), "{version}");
    let check = stdout(Command::new(SBIN).args(["policy", "check", "/etc/limiter/limiter.toml"]));
    assert!(check.contains("valid"), "{check}");
    for page in ["limiter", "limiter-run", "limiter-policy-check"] {
        let at = stdout(Command::new("man").args(["-w", page]));
        assert_eq!(at.trim(), format!("/usr/share/man/man8/{page}.8.gz"));
    }
    // bash-completion loads the packaged script on demand and completes a verb.
    let completed = stdout(Command::new("bash").arg("-c").arg(
        "source /usr/share/bash-completion/bash_completion; _completion_loader limiter; \
         f=$(complete -p limiter | sed -E 's/.* -F ([^ ]+) .*/\\1/'); \
         COMP_WORDS=(limiter pol); COMP_CWORD=1; COMP_LINE='limiter pol'; COMP_POINT=11; \
         \"$f\" limiter pol limiter; printf '%s\\n' \"${COMPREPLY[@]}\"",
    ));
    assert_eq!(completed.trim(), "policy", "bash completion of `limiter pol`");
    assert!(Command::new("getent").args(["group", "limiter"]).output().unwrap().status.success());

    // Remove: the conffile stays (as dpkg keeps conffiles), nothing else.
    ok(Command::new("dpkg").args(["-r", "limiter"]));
    assert!(dpkg_status().starts_with("deinstall ok config-files"), "{}", dpkg_status());
    let left: Vec<&String> = files.iter().filter(|f| Path::new(f).is_file()).collect();
    assert_eq!(left, ["/etc/limiter/limiter.toml"], "left after dpkg -r");
    // Purge: nothing of the package is left; the group stays, as Debian
    // does with system groups.
    ok(Command::new("dpkg").args(["-P", "limiter"]));
    assert!(!dpkg_status().contains("installed") && !dpkg_status().contains("config-files"), "{}", dpkg_status());
    let left: Vec<&String> = files.iter().filter(|f| Path::new(f).is_file()).collect();
    assert!(left.is_empty(), "left after dpkg -P: {left:?}");
    for dir in ["/etc/limiter", "/usr/share/limiter", "/usr/share/doc/limiter"] {
        assert!(!Path::new(dir).exists(), "{dir} left after purge");
    }
    drop(installed);
}

/// Removes the test's pins even when it fails.
struct Unpin(PathBuf);

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = limiter::dataplane::pin::unload(&self.0, false);
    }
}

/// The control socket of the test's daemon, where the unit puts an
/// instance's (`/run/limiter/IFACE.sock`).
fn socket() -> PathBuf {
    PathBuf::from(format!("/run/limiter/pkgtest{}.sock", std::process::id()))
}

/// The installed binary as the unit runs it, in the test's namespace.
fn start(net: &VethPair, pins: &Path) -> (Guard, String) {
    let mut c = net.b.net_command(SBIN);
    c.args(["run", "--iface", B_IF, "--pin", "--pin-dir"]).arg(pins).arg("--socket");
    std::fs::create_dir_all("/run/limiter").unwrap();
    c.arg(socket());
    c.args(["--rate", &RATE.to_string(), "--burst", &BURST.to_string(), "--status-interval", "0"]);
    let (g, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "pinned in", Duration::from_secs(20), &mut log).unwrap();
    (g, log)
}

fn attached(net: &VethPair) -> bool {
    let link = stdout(Command::new("ip").args(["-n", &net.b.name, "link", "show", B_IF]));
    link.contains("xdp")
}

/// Version N installed, its daemon running pinned under a flood; N+1
/// installed over it and the daemon restarted as the postinst would
/// (`systemctl try-restart`: stop, then start the new binary): the flood
/// gets one allowance over the whole run, the conforming source loses
/// nothing. Then remove keeps the pins enforcing, purge removes them.
#[test]
fn upgrade_in_place_under_a_flood_lets_nothing_through() {
    let _alone = limiter_tests::alone(module_path!());
    let (deb1, deb2) = debs();
    let installed = Installed::new(deb1);
    let net = VethPair::new("pkg");
    net.add_source(FLOOD_SRC);
    net.add_source(CONFORM_SRC);
    // Named like the unit's pin directories (limiter-IFACE): a purge removes it.
    let pins = PathBuf::from(format!("/sys/fs/bpf/limiter-pkgtest{}", std::process::id()));
    let _unpin = Unpin(pins.clone());

    let (mut daemon, log) = start(&net, &pins);
    assert!(log.contains("new maps; new link"), "{log}");
    let secs = 12.0;
    let t0 = std::time::Instant::now();
    let traffic = scenario::start_traffic(&net, env!("CARGO_BIN_EXE_netload").as_ref(), 300_000, 400, secs).unwrap();
    thread::sleep(Duration::from_secs(2));

    let before = stdout(Command::new("stat").args(["-c", "%i", SBIN]));
    let out = dpkg(&["-i"], deb2);
    assert!(dpkg_status().ends_with("-2"), "{}", dpkg_status());
    assert_ne!(stdout(Command::new("stat").args(["-c", "%i", SBIN])), before, "the binary was not replaced");
    println!("{}\ndpkg -i of N+1 done at {:.1} s", out.trim(), t0.elapsed().as_secs_f64());
    // try-restart: SIGTERM, then the new binary.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(daemon.0.id()).unwrap(), libc::SIGTERM) };
    assert!(daemon.0.wait().unwrap().success());
    let d0 = limiter_tests::kernel::pinned_rate_limited(&pins);
    let (daemon, log) = start(&net, &pins);
    assert!(log.contains("re-adopted pinned maps") && log.contains("replaced the program on the pinned link"), "{log}");
    println!("N+1 running at {:.1} s", t0.elapsed().as_secs_f64());
    thread::sleep(Duration::from_millis(200));
    assert!(limiter_tests::kernel::pinned_rate_limited(&pins) > d0, "no drops counted since the restart");
    // The operator's commands find the service's socket without --socket.
    let status = stdout(Command::new(SBIN).args(["--json", "status"]));
    assert!(status.contains(B_IF), "limiter status without --socket: {status}");

    let Delivered { flood_sent, flood_secs, flood_got, conform_sent, conform_got } = traffic.finish().unwrap();
    println!(
        "upgrade under flood: flood sent {flood_sent} got {flood_got} in {flood_secs:.3} s; conforming {conform_got}/{conform_sent}"
    );
    // One allowance over the whole run: a gap in enforcement or a reset
    // bucket (a fresh burst of 2,000) would exceed it.
    let bound = BURST as f64 + RATE as f64 * flood_secs * 1.01 + RATE as f64 * 0.01;
    assert!((flood_got as f64) <= bound, "flood got {flood_got} > {bound:.0}");
    assert!(flood_sent as f64 >= 10.0 * bound, "flood too weak: {flood_sent}");
    assert_eq!(
        conform_got,
        conform_sent,
        "conforming packets lost across the upgrade; links:\n{}",
        net.link_counters()
    );

    // The service stopped (prerm remove), the package removed: the pinned
    // program keeps enforcing. Purged: its pins go and it detaches.
    drop(daemon);
    ok(Command::new("dpkg").args(["-r", "limiter"]));
    assert!(pins.join(limiter::dataplane::pin::LINK).exists(), "pins gone on remove");
    assert!(attached(&net), "dpkg -r detached the program");
    ok(Command::new("dpkg").args(["-P", "limiter"]));
    assert!(!pins.exists(), "dpkg -P left {}", pins.display());
    assert!(!attached(&net), "still attached after purge");
    drop(installed);
}
