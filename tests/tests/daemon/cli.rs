//! The `limiter` command's behaviour at its edges: bad arguments, an
//! interface that cannot run native XDP, and a clean generic-mode attach.

use std::process::{Command, Output};

use limiter_tests::{kernel::require_root, netns::NetNs, scenario::locate_bin};

fn limiter(args: &[&str]) -> Output {
    Command::new(locate_bin("limiter").expect("limiter binary")).args(args).output().expect("run limiter")
}

fn stderr_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr).lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
}

#[test]
fn bad_arguments_get_one_line_and_exit_2() {
    let _alone = limiter_tests::alone(module_path!());
    for args in [
        &["run"][..],
        &["run", "--iface", "x", "--rate", "abc"],
        &["run", "--iface", "x", "--mode", "turbo"],
        &["run", "--iface", "x", "--v4-prefix", "33"],
        &["run", "--iface", "x", "--v6-prefix", "129"],
        &["run", "--iface", "x", "--cost", "furlongs"],
        &["run", "--iface", "x", "--capacity", "0"],
        &["frobnicate"],
        &[],
        &["prefix", "set", "198.18.0.0/16"],
        &["prefix", "deny", "nonsense"],
        &["prefix", "show", "198.18.0.0/33"],
        &["prefix", "set", "198.18.0.0/16", "--rate", "x", "--burst", "1"],
        &["prefix"],
        &["policy", "check"],
        &["replay"],
        &["completions", "tcsh"],
        &["status", "--bogus"],
    ] {
        let o = limiter(args);
        let lines = stderr_lines(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {lines:?}");
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert!(lines[0].starts_with("limiter: "), "{args:?}: {lines:?}");
    }
    // The line names what is missing, not only that something is.
    for (args, missing) in [
        (&["run"][..], "--iface"),
        (&["run", "--iface", "x", "--new-source-burst", "5"], "--new-source-rate"),
        (&["run", "--iface", "x", "--aggregate-rate", "5"], "--aggregate-burst"),
    ] {
        let lines = stderr_lines(&limiter(args));
        assert!(lines.len() == 1 && lines[0].contains(missing), "{args:?}: {lines:?}");
    }
}

#[test]
fn invalid_policy_values_are_refused_with_the_field_named() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    for (args, field) in [
        (&["run", "--iface", "lo", "--rate", "0"][..], "rate"),
        (&["run", "--iface", "lo", "--burst", "0"], "burst"),
        (&["run", "--iface", "lo", "--cost", "bytes", "--burst", "100"], "burst"),
    ] {
        let o = limiter(args);
        let lines = stderr_lines(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        assert!(lines[0].contains(&format!("{field}:")), "{args:?}: {lines:?}");
    }
}

#[test]
fn help_works_on_every_verb() {
    let _alone = limiter_tests::alone(module_path!());
    let verbs: [&[&str]; 26] = [
        &[],
        &["run"],
        &["unload"],
        &["status"],
        &["stats"],
        &["policy"],
        &["policy", "check"],
        &["policy", "apply"],
        &["policy", "show"],
        &["prefix"],
        &["prefix", "list"],
        &["prefix", "set"],
        &["prefix", "allow"],
        &["prefix", "deny"],
        &["prefix", "unset"],
        &["prefix", "load"],
        &["replay"],
        &["completions"],
        &["man"],
        &["top"],
        &["prefix", "show"],
        &["fleet", "status"],
        &["upstream", "list"],
        &["upstream", "announce"],
        &["upstream", "blackhole"],
        &["upstream", "withdraw"],
    ];
    for v in verbs {
        let mut args = v.to_vec();
        args.push("--help");
        let o = limiter(&args);
        assert!(o.status.success(), "{args:?}");
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains("Usage"), "{args:?}");
        // A leaf verb shows how it is used, each example its own verb;
        // the options every verb takes stand apart from its own.
        let leaf = !help.contains("Commands:");
        if leaf && !v.is_empty() {
            let examples: Vec<&str> =
                help.split("Examples:").nth(1).unwrap_or_default().lines().filter(|l| !l.trim().is_empty()).collect();
            assert!(!examples.is_empty(), "{args:?} has no example:\n{help}");
            let verb = format!("limiter {}", v.join(" "));
            assert!(examples.iter().all(|e| e.trim().contains(&verb)), "{args:?}: {examples:?}");
        }
        let global = help.split("Global options:").nth(1).unwrap_or_default();
        assert!(global.contains("--json") && global.contains("--socket"), "{args:?}:\n{help}");
    }
}

#[test]
fn native_mode_on_a_driver_without_it_suggests_generic() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    // Loopback has no native XDP; use the namespace's own.
    let ns = NetNs::new("cli");
    let bin = locate_bin("limiter").unwrap();
    let o = ns.command(&bin).args(["run", "--iface", "lo"]).output().unwrap();
    let lines = stderr_lines(&o);
    assert_eq!(o.status.code(), Some(1), "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("native") && lines[0].contains("--mode generic"), "{lines:?}");

    // Generic mode attaches there, prints status, and detaches on SIGINT.
    let child = ns
        .command(&bin)
        .args(["run", "--iface", "lo", "--mode", "generic", "--status-interval", "0.2", "--socket"])
        .arg(limiter_tests::scenario::unique_socket("cli-lo"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("attached to lo (generic)"), "{out}");
    assert!(out.lines().any(|l| l.contains(" INFO passed ") && l.contains("tracked ")), "{out}");
    assert!(out.contains("SIGINT: detached from lo"), "{out}");

    // --log-json: one JSON object per line, with the event's fields.
    let child = ns
        .command(&bin)
        .args(["run", "--iface", "lo", "--mode", "generic", "--log-json", "--metrics", "off", "--socket"])
        .arg(limiter_tests::scenario::unique_socket("cli-json"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let attach = events.iter().find(|e| e["event"] == "attach").expect("an attach event");
    assert_eq!(
        (attach["iface"].as_str(), attach["mode"].as_str(), attach["version"].as_u64()),
        (Some("lo"), Some("generic"), Some(1))
    );
    let detach = events.iter().find(|e| e["event"] == "detach").expect("a detach event");
    assert_eq!(detach["signal"], "SIGTERM");
}

#[test]
fn unknown_interface_is_one_clear_line() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let o = limiter(&["run", "--iface", "nosuchif0"]);
    let lines = stderr_lines(&o);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(lines, vec!["limiter: interface nosuchif0 does not exist".to_owned()]);
}

#[test]
fn policy_check_validates_offline() {
    let _alone = limiter_tests::alone(module_path!());
    let tmp = limiter_tests::kernel::TempDir::new("check");
    let dir = &tmp.0;
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "rate = 50\nburst = 100\n[[class]]\nname = \"dns\"\nprotocol = \"udp\"\nports = [53]\nrate = 10\nburst = 20\n",
    )
    .unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "rate = 50\n\n[[class]]\nname = \"dns\"\nprotocol = \"udp\"\nports = [53]\nrate = 10\nburst = 20\ncolour = \"blue\"\n").unwrap();

    let o = limiter(&["policy", "check", good.to_str().unwrap()]);
    assert!(o.status.success(), "{:?}", stderr_lines(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("valid") && out.contains("class dns: rate 10 burst 20"), "{out}");

    let o = limiter(&["policy", "check", good.to_str().unwrap(), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["valid"], serde_json::Value::Bool(true), "{j}");

    let o = limiter(&["policy", "check", bad.to_str().unwrap()]);
    let lines = stderr_lines(&o);
    assert_eq!(o.status.code(), Some(1), "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&format!("{}:9: class[0].colour: unknown field", bad.display())), "{lines:?}");

    // Under -j the error is a JSON object where the answer would be, with
    // the same exit status; a usage error too (status 2).
    for (args, code) in [
        (vec!["policy", "check", bad.to_str().unwrap(), "-j"], 1),
        (vec!["prefix", "deny", "not-a-cidr", "--json"], 2),
    ] {
        let o = limiter(&args);
        assert_eq!(o.status.code(), Some(code), "{args:?}");
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let error = j["error"].as_str().unwrap_or_else(|| panic!("{j}"));
        assert!(error.contains(if code == 1 { "class[0].colour" } else { "not-a-cidr" }), "{j}");
        assert!(o.stderr.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }

    let o = limiter(&["policy", "check", dir.join("missing.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr_lines(&o).len(), 1);
}

/// `limiter --version` names the crate's version and the commit the binary
/// was built from (this tree's HEAD, `-dirty` if it had changes).
#[test]
fn version_names_the_git_revision() {
    let _alone = limiter_tests::alone(module_path!());
    let o = limiter(&["--version"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let head = Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout);
    let want = format!("limiter {} (git {}", env!("CARGO_PKG_VERSION"), head.trim());
    assert!(out.starts_with(&want), "{out:?} does not start with {want:?}");
}

/// `limiter man --dir` writes limiter(8) and a page per verb and sub-verb,
/// in section 8 (system administration: the package installs the binary
/// in /usr/sbin), their references to each other too.
#[test]
fn man_dir_writes_a_page_per_verb() {
    let _alone = limiter_tests::alone(module_path!());
    let dir = limiter_tests::kernel::TempDir::new("man");
    let o = limiter(&["man", "--dir", dir.0.to_str().unwrap()]);
    assert!(o.status.success(), "{:?}", stderr_lines(&o));
    for page in ["limiter.8", "limiter-run.8", "limiter-policy-check.8", "limiter-prefix-deny.8"] {
        let text = std::fs::read_to_string(dir.0.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(&format!(".TH {} 8", page.trim_end_matches(".8"))), "{page} is not its man page");
    }
    let top = std::fs::read_to_string(dir.0.join("limiter.8")).unwrap();
    assert!(top.contains("limiter\\-policy(8)"), "limiter(8) does not name limiter-policy(8)");
    let pages = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap());
    let stray: Vec<String> = pages.filter(|p| !p.ends_with(".8")).collect();
    assert!(stray.is_empty(), "pages outside section 8: {stray:?}");
}

/// `limiter man --policy` is limiter.toml(5): man renders it, and its body
/// is the shipped policy file line by line (which the unit tests hold to
/// the parser: every key, every default).
#[test]
fn the_policy_file_has_its_man_page_in_section_5() {
    let _alone = limiter_tests::alone(module_path!());
    let o = limiter(&["man", "--policy"]);
    assert!(o.status.success(), "{:?}", stderr_lines(&o));
    let page = String::from_utf8(o.stdout).unwrap();
    assert!(page.starts_with(".TH LIMITER.TOML 5 "), "{}", &page[..page.len().min(80)]);
    let dir = limiter_tests::kernel::TempDir::new("man5");
    let file = dir.0.join("limiter.toml.5");
    std::fs::write(&file, &page).unwrap();
    let shown = Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANWIDTH", "200")
        .env("MAN_KEEP_FORMATTING", "0")
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let shown = String::from_utf8_lossy(&shown.stdout);
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/limiter.toml")).unwrap();
    for line in shipped.lines().filter(|l| l.starts_with("#[") || l.starts_with("#rate") || l.starts_with("#limit")) {
        assert!(shown.contains(line), "man limiter.toml does not show {line:?}");
    }
}
