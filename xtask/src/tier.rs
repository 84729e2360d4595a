//! The guest tier of `cargo xtask test`: the kernel-facing tests, built on
//! the host, run in a guest of each distribution kernel users run
//! ([`guest::RELEASES`]: all of them on the oldest, what depends on the
//! kernel on the newer), with a per-kernel report of what ran and what
//! passed. A guest that does not boot, or a test binary that is missing,
//! fails the tier: it never skips silently.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{digest::Digest, guest};

/// What runs in the guest of the oldest kernel users run (Debian 12's
/// 6.1, the first of [`guest::RELEASES`]): a module of a tier binary of
/// `limiter-tests` (`binary::module`) and the tests of it (all when none
/// is named). Each is a kernel-facing behaviour: loading and verifying,
/// BPF_PROG_TEST_RUN, the daemon on a veth, SYN cookies, out-of-state
/// TCP under a spoofed flood, forwarding at the driver to backends that
/// decapsulate with the kernel's own tunnel, window quotas,
/// the deny set, country and ASN groups, pins across restarts and
/// upgrades, and sharing the interface through libxdp's dispatcher.
pub const PLAN: &[(&str, &[&str])] = &[
    ("kernel::verifier", &[]),
    ("kernel::fixtures", &[]),
    ("kernel::capture", &[]),
    ("kernel::admission", &[]),
    ("daemon::netns_flood", &["flood_is_held_to_its_allowance_and_conforming_prefix_loses_nothing"]),
    ("daemon::syn_flood", &["--ignored", "twenty_new_clients_connect_on_their_first_syn_during_a_spoofed_syn_flood"]),
    ("daemon::kernel_features", &[]),
    ("kernel::deny_set", &[]),
    ("kernel::groups", &[]),
    ("kernel::answers", &[]),
    ("kernel::tcp_state", &[]),
    ("daemon::tcp_state", &[]),
    ("kernel::tunnel", &[]),
    ("daemon::tunnel", &[]),
    ("daemon::feeds", &[]),
    // The upgrade test stays on the host: an emulated upgrade takes tens
    // of seconds, its bucket refills meanwhile, and the 1 s flood after
    // it (about 2,300 packets under emulation) fits its allowance.
    ("daemon::restart", &["kill_9_keeps_enforcing_and_restart_keeps_buckets"]),
    ("daemon::share_interface", &[]),
    ("daemon::share_restart", &[]),
];

/// What runs in the guests of the newer releases (Debian 13's 6.12):
/// what depends on what the kernel offers beyond the oldest, and on the
/// host's 6.18 too: the verifier's verdict on every entry point, the
/// socket lookups of own answers and of out-of-state TCP (in test runs
/// and under a live flood), the SYN
/// cookie helpers, the frame
/// copy of a capture (`bpf_xdp_load_bytes`), XDP on a veth, the tunnel's
/// `bpf_fib_lookup` and the kernel's `tunl0` behind it,
/// and libxdp's dispatcher (which 6.12 refuses a component of). The rest
/// of [`PLAN`] (the program's arithmetic through BPF_PROG_TEST_RUN, the
/// daemon's own logic) runs the same bytecode on the same map types,
/// checked on the oldest kernel and the host's newest; the guests run one
/// after the other (two at once on two cores starved the emulated
/// floods: 4.25x an allowance where 5x is asked).
pub const NEWER: &[&str] = &[
    "kernel::verifier",
    "kernel::capture",
    "kernel::answers",
    "kernel::tcp_state",
    "daemon::tcp_state",
    "kernel::tunnel",
    "daemon::tunnel",
    "daemon::netns_flood",
    "daemon::syn_flood",
    "daemon::kernel_features",
    "daemon::share_interface",
    "daemon::share_restart",
];

/// [`PLAN`]'s entries named in [`NEWER`], as [`PLAN`] runs them.
fn newer_plan() -> Vec<(&'static str, &'static [&'static str])> {
    PLAN.iter().filter(|(entry, _)| NEWER.contains(entry)).copied().collect()
}

/// What runs in a guest of a kernel older than the oldest supported
/// ([`guest::OLDER`]): the daemon's refusal (an ignored test on the host).
pub const OLDER_PLAN: &[(&str, &[&str])] = &[("guest::kernels", &["--ignored"])];

/// The tier binary of a plan's entry, and the arguments that run its
/// module's tests: each named test exactly (`module::test`), or every
/// test under `module::` when none is named; flags (`--ignored`) as they
/// are.
fn args_of(entry: &str, filters: &[&str]) -> anyhow::Result<(String, Vec<String>)> {
    let (binary, module) = entry.split_once("::").with_context(|| format!("{entry} is not binary::module"))?;
    let mut args = vec!["--test-threads=1".to_owned(), "--color=never".to_owned()];
    let (flags, names): (Vec<&str>, Vec<&str>) = filters.iter().partition(|f| f.starts_with("--"));
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    if names.is_empty() {
        args.push(format!("{module}::"));
    } else {
        args.push("--exact".to_owned());
        args.extend(names.iter().map(|n| format!("{module}::{n}")));
    }
    Ok((binary.to_owned(), args))
}

/// The longest one guest may take (the oldest release's run, the
/// longest, is about 25 minutes).
const GUEST_TIMEOUT: Duration = Duration::from_mins(35);

/// One guest's tally.
#[derive(Default)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Per target: each test's name and result, in order.
    pub tests: BTreeMap<String, Vec<(String, String)>>,
    /// What each failed test said.
    pub digest: Digest,
}

/// The test executables of `limiter-tests`, by target name (built first,
/// as `cargo test --workspace` builds them: with the features the whole
/// workspace unifies, so after the host's run nothing is built again; `-p
/// limiter-tests` alone resolved other features and rebuilt three crates,
/// 1 min 44 s of a CI run).
pub fn test_executables() -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let out = crate::cargo_command()
        .args(["test", "--workspace", "--tests", "--no-run", "--message-format=json"])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed: {}", out.status);
    }
    let mut exes = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else { continue };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str()) else { continue };
        let ours = v["package_id"].as_str().is_some_and(|p| p.contains("#limiter-tests@"));
        if ours && v["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test")) {
            exes.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    Ok(exes)
}

/// The bash command a guest runs: each planned target, one test at a time,
/// marked so the host can tell targets apart.
fn script(exes: &BTreeMap<String, PathBuf>, plan: &[(&str, &[&str])]) -> anyhow::Result<String> {
    let mut s = String::from("uname -r | sed 's/^/tier: kernel /'\n");
    for (target, filters) in plan {
        let (binary, args) = args_of(target, filters)?;
        let exe = exes.get(&binary).with_context(|| format!("no test executable for {binary}"))?;
        let _ = writeln!(s, "echo 'tier: target {target}'");
        let _ = writeln!(s, "timeout -k 10 900 {} {} 2>&1", exe.display(), args.join(" "));
        let _ = writeln!(s, "echo \"tier: status {target} $?\"");
    }
    Ok(s)
}

/// Whether `l` has the guest kernel saying it crashed: a console message
/// (`[  816.054523] Oops: int3: ...`, also after a test's own output on
/// the same line) of an oops, a BUG or a panic.
fn is_crash(l: &str) -> bool {
    l.match_indices('[').any(|(i, _)| {
        let Some((stamp, rest)) = l[i + 1..].split_once("] ") else { return false };
        stamp.trim().parse::<f64>().is_ok() && ["Oops: ", "BUG: ", "Kernel panic"].iter().any(|w| rest.starts_with(w))
    })
}

/// What a guest's output said so far.
#[derive(Default)]
struct Reader {
    tally: Tally,
    target: String,
    statuses: BTreeMap<String, i32>,
    /// `failures:` lines seen in this target's output: the harness prints
    /// one before the failed tests' output and one before their names.
    failures: u8,
    /// The guest kernel's own crash, if it printed one (an oops, a BUG, a
    /// panic).
    crash: Option<String>,
}

impl Reader {
    /// Take one line of the guest's output (plain test output:
    /// `--color=never`).
    fn line(&mut self, l: &str) {
        self.tally.digest.line(l);
        if self.crash.is_none() && is_crash(l) {
            self.crash = Some(l.trim().to_owned());
        }
        // The harness's closing list of failed tests: a test whose
        // `... FAILED` was split by other output (libbpf's) is still named.
        if l == "failures:" {
            self.failures += 1;
            return;
        }
        if self.failures >= 2 {
            let name = l.trim();
            let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if l.starts_with("    ") && plain {
                let tests = self.tally.tests.entry(self.target.clone()).or_default();
                if !tests.iter().any(|(n, r)| n == name && r == "FAILED") {
                    tests.retain(|(n, _)| n != name);
                    tests.push((name.to_owned(), "FAILED".into()));
                    self.tally.failed += 1;
                }
                return;
            }
            if l.starts_with("test result:") {
                self.failures = 0;
            }
        }
        if let Some(name) = l.strip_prefix("tier: target ") {
            name.clone_into(&mut self.target);
            self.failures = 0;
        } else if let Some((name, st)) = l.strip_prefix("tier: status ").and_then(|r| r.split_once(' ')) {
            self.statuses.insert(name.to_owned(), st.trim().parse().unwrap_or(-1));
        } else if let Some((name, result)) = l.strip_prefix("test ").and_then(|r| r.rsplit_once(" ... ")) {
            let t = &mut self.tally;
            match result.trim() {
                "ok" => t.passed += 1,
                "FAILED" => t.failed += 1,
                r if r.starts_with("ignored") => t.ignored += 1,
                _ => return,
            }
            t.tests.entry(self.target.clone()).or_default().push((name.to_owned(), result.trim().to_owned()));
        }
    }

    /// The tally, where a target that ended badly without a failed test
    /// (it crashed, timed out or never ran) counts as one failure.
    fn finish(mut self, plan: &[(&str, &[&str])]) -> Tally {
        let t = &mut self.tally;
        for (target, _) in plan {
            let failed_test = t.tests.get(*target).is_some_and(|v| v.iter().any(|(_, r)| r == "FAILED"));
            let what = match self.statuses.get(*target) {
                Some(0) => continue,
                Some(_) if failed_test => continue,
                Some(st) => format!("exit {st}"),
                None => "never ran".to_owned(),
            };
            t.failed += 1;
            t.tests.entry((*target).to_owned()).or_default().push(("(the binary)".into(), what));
        }
        self.tally
    }
}

/// Run [`PLAN`] in a guest of the oldest release, [`NEWER`] in
/// one of each newer, and the older kernel's plan in a guest of
/// [`guest::OLDER`], one after the other; print each guest's report.
/// Returns the tallies, one a guest, in order.
pub fn run_all(exes: &BTreeMap<String, PathBuf>) -> anyhow::Result<Vec<(String, Tally)>> {
    let newer = newer_plan();
    let plans = std::iter::once(PLAN).chain(std::iter::repeat(newer.as_slice()));
    let runs = guest::RELEASES.iter().copied().zip(plans).chain([(guest::OLDER, OLDER_PLAN)]);
    let mut all = Vec::new();
    for (r, plan) in runs {
        let k = guest::fetch(r).with_context(|| format!("{}'s kernel", r.label))?;
        all.push(run_one(r, plan, &k, &script(exes, plan)?)?);
    }
    println!("tier: what ran on each kernel");
    for (kernel, t) in &all {
        for (target, tests) in &t.tests {
            for (name, result) in tests {
                let binary = target.split_once("::").map_or(target.as_str(), |(b, _)| b);
                println!("tier:   {kernel:<32} {binary}::{name} {result}");
            }
        }
    }
    for (kernel, t) in &all {
        t.digest.print(&format!("tier: {kernel}"));
    }
    Ok(all)
}

/// Boot a guest of `k` (of release `r`) and run `script` (`plan`'s) in
/// it; its name and tally.
fn run_one(
    r: guest::Release,
    plan: &[(&str, &[&str])],
    k: &guest::Kernel,
    script: &str,
) -> anyhow::Result<(String, Tally)> {
    let started = Instant::now();
    println!("tier: {} ({}): booting", r.label, k.version);
    // One boot more if the first hangs before the command starts, or
    // if the guest's own kernel crashes (an oops in 6.12's XDP
    // dispatcher text poke while a neighbour attached, under QEMU's
    // emulation, seen once in many runs): said, and the crashed run's
    // results are not counted.
    let mut attempts = 0;
    let (outcome, reader) = loop {
        attempts += 1;
        let mut reader = Reader::default();
        let result = guest::run(k, script, GUEST_TIMEOUT, |l: &str| {
            println!("[{}] {l}", k.version);
            reader.line(l);
        });
        match result {
            Err(e) if attempts == 1 && e.to_string().contains("did not boot") => {
                println!("tier: {e:#}; booting once more");
            }
            Err(e) if attempts == 1 && reader.crash.is_some() => {
                let crash = reader.crash.unwrap_or_default();
                println!(
                    "tier: {} ({}): the guest's kernel crashed ({crash}): {e:#}; booting once more, this run's \
                     results not counted",
                    r.label, k.version
                );
            }
            r => break (r?, reader),
        }
    };
    let mut t = reader.finish(plan);
    if outcome.timed_out {
        t.failed += 1;
    }
    println!(
        "tier: {} ({}): {} passed, {} failed, {} ignored in {:.0} s{}",
        r.label,
        k.version,
        t.passed,
        t.failed,
        t.ignored,
        started.elapsed().as_secs_f64(),
        if outcome.timed_out { " (timed out)" } else { "" }
    );
    Ok((format!("{} ({})", r.label, k.version), t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a guest printed in the tier's second run on 6.12: a test
    /// whose `FAILED` came on a line of its own after libbpf's chatter.
    #[test]
    fn a_failure_split_by_other_output_and_a_target_that_never_ran_both_count() {
        let plan: &[(&str, &[&str])] = &[("daemon::share", &[]), ("kernel::verifier", &[])];
        let mut r = Reader::default();
        for l in [
            "tier: target daemon::share",
            "test share::a_program_without_a_dispatcher ... ok",
            "test share::auto_joins ... libbpf: elf: skipping unrecognized data section(7) xdp_metadata",
            "FAILED",
            "failures:",
            "---- share::auto_joins stdout ----",
            "    indented output",
            "failures:",
            "    share::auto_joins",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "tier: status daemon::share 101",
        ] {
            r.line(l);
        }
        let t = r.finish(plan);
        assert_eq!((t.passed, t.failed), (1, 2), "auto_joins, and verifier, which never ran");
        assert!(t.tests["daemon::share"].contains(&("share::auto_joins".to_owned(), "FAILED".to_owned())));
        assert!(!t.tests["daemon::share"].iter().any(|(n, _)| n == "indented"));
        assert_eq!(t.tests["kernel::verifier"], vec![("(the binary)".to_owned(), "never ran".to_owned())]);
    }

    #[test]
    fn a_binary_that_ended_badly_without_a_failed_test_counts_once() {
        let plan: &[(&str, &[&str])] = &[("daemon::restart", &[])];
        let mut r = Reader::default();
        for l in ["tier: target daemon::restart", "test restart::kill_9 ... ok", "tier: status daemon::restart 124"] {
            r.line(l);
        }
        let t = r.finish(plan);
        assert_eq!((t.passed, t.failed), (1, 1));
    }

    /// A module alone runs every test under it; named tests run exactly,
    /// so `restart::x` does not also run `share_restart::x`.
    #[test]
    fn a_plan_entry_runs_its_module_or_exactly_its_named_tests() {
        let (bin, args) = args_of("kernel::verifier", &[]).unwrap();
        assert_eq!((bin.as_str(), &args[2..]), ("kernel", &["verifier::".to_owned()][..]));
        let (bin, args) = args_of("daemon::syn_flood", &["--ignored", "twenty"]).unwrap();
        assert_eq!(bin, "daemon");
        assert_eq!(args[2..], ["--ignored", "--exact", "syn_flood::twenty"]);
        assert!(args_of("verifier", &[]).is_err());
    }

    /// Every entry of the plans names a module that exists.
    #[test]
    fn every_planned_module_is_a_file_of_its_tier() {
        let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        for (entry, _) in PLAN.iter().chain(OLDER_PLAN) {
            let (binary, module) = entry.split_once("::").unwrap();
            let file = tests.join(binary).join(format!("{module}.rs"));
            assert!(file.is_file(), "{entry}: no {}", file.display());
        }
    }

    /// The newer releases run a part of what the oldest runs, every entry
    /// they name.
    #[test]
    fn the_newer_plan_is_a_part_of_the_plan() {
        assert_eq!(newer_plan().len(), NEWER.len(), "an entry of NEWER is not in PLAN");
    }

    /// The guest kernel's crash is told from a test's own output.
    #[test]
    fn a_guest_kernel_crash_is_told_from_test_output() {
        assert!(is_crash("[  816.054523] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"));
        assert!(is_crash("[   3.1] Kernel panic - not syncing: VFS"));
        assert!(is_crash("[12.5] BUG: kernel NULL pointer dereference, address: 0"));
        assert!(!is_crash("test share_restart::x ... ok"));
        assert!(!is_crash("[6.12.118] Oops: not a timestamp"));
        assert!(is_crash("test share_restart::x ... [  816.054523] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"));
        assert!(!is_crash("[  816.059280]  veth_xdp_rcv_skb+0x170/0x5b0 [veth]"));
        let mut r = Reader::default();
        r.line("test a ... ok");
        assert!(r.crash.is_none());
        r.line("test b ... [  816.054523] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI");
        r.line("[  816.062342] Kernel panic - not syncing: Fatal exception in interrupt");
        assert_eq!(r.crash.as_deref(), Some("test b ... [  816.054523] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"));
    }
}
