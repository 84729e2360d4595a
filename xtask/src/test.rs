//! `cargo xtask test [WHAT]`: everything (what CI runs), or a part of it
//! for the loop of a change: `quick` (the checks, the unit tests and the
//! kernel tier on the host: a few minutes), a tier or one module of it
//! (`daemon`, `daemon::crowdsec_bouncer`), the unit tests (`unit`), or
//! the guest tier alone (`guests`).

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::Stdio,
};

use anyhow::{Context as _, bail};

use crate::{cargo, digest::Digest, guest, setup, tier};

/// The root-only test tiers: the test binaries of `limiter-tests`
/// (`tests/tests/TIER/`).
const TIERS: &[&str] = &["kernel", "daemon", "system", "guest"];

/// What `cargo xtask test` runs.
#[derive(Debug, PartialEq, Eq)]
pub enum Selection {
    /// The checks, every host test, then the guest tier: what CI runs.
    Everything,
    /// The checks, the unit tests and the kernel tier on the host.
    Quick,
    /// The unit tests (every crate's own, and `limiter-tests`' library).
    Unit,
    /// A tier's binary, or one module of it.
    Tier { tier: String, module: Option<String> },
    /// The guest tier alone.
    Guests,
}

impl Selection {
    /// Read `what` (none: everything); an unknown tier or module is a
    /// one-line error naming what there is.
    pub fn parse(what: Option<&str>) -> anyhow::Result<Self> {
        let Some(what) = what else { return Ok(Self::Everything) };
        match what {
            "quick" => return Ok(Self::Quick),
            "unit" => return Ok(Self::Unit),
            "guests" => return Ok(Self::Guests),
            _ => {}
        }
        let (tier, module) = match what.split_once("::") {
            Some((t, m)) => (t, Some(m)),
            None => (what, None),
        };
        if !TIERS.contains(&tier) {
            bail!("no test selection {what:?}: quick, unit, guests, or a tier ({}) or TIER::MODULE", TIERS.join(", "));
        }
        if let Some(m) = module {
            // A nested module (`adversarial::upstream`) is a file of a
            // folder (`adversarial/upstream.rs`).
            let file = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/tests")
                .join(tier)
                .join(format!("{}.rs", m.replace("::", "/")));
            let dir = file.with_extension("");
            if m.is_empty() || !(file.is_file() || dir.join("mod.rs").is_file() || dir.is_dir()) {
                bail!("no module {m:?} in the {tier} tier (tests/tests/{tier}/)");
            }
        }
        Ok(Self::Tier { tier: tier.to_owned(), module: module.map(str::to_owned) })
    }
}

/// Run `selection`; the checks (fmt, clippy) first unless `no_lint` (and
/// never for one tier or the guests alone).
pub fn run(selection: &Selection, no_lint: bool) -> anyhow::Result<()> {
    crate::require_root()?;
    setup::setup(match selection {
        Selection::Quick | Selection::Unit => setup::Need::Run,
        _ => setup::Need::Tests,
    })?;
    if matches!(selection, Selection::Everything | Selection::Guests) {
        setup::install_missing(guest::PACKAGES)?;
    }
    if !no_lint && matches!(selection, Selection::Everything | Selection::Quick) {
        cargo(&["fmt", "--all", "--", "--check"])?;
        cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
        crate::clippy_ebpf()?;
    }
    // Integration tests run the `limiter` binary itself.
    cargo(&["build", "--bins"])?;
    // The host's failures, printed again at the very end (after the
    // guests' half hour, a CI log's tail would not reach them).
    let mut failures = Digest::default();
    let host = match selection {
        Selection::Everything => Some(host_tests(&["--workspace"], &[], &mut failures)),
        Selection::Quick => {
            Some(host_tests(&["--workspace", "--lib", "--bins"], &[], &mut failures).and_then(|unit| {
                let kernel = host_tests(&["-p", "limiter-tests", "--test", "kernel"], &[], &mut failures)?;
                Ok(unit + kernel)
            }))
        }
        Selection::Unit => Some(host_tests(&["--workspace", "--lib", "--bins"], &[], &mut failures)),
        Selection::Tier { tier, module } => {
            let args = ["-p", "limiter-tests", "--test", tier.as_str()];
            let filters = match module {
                Some(m) => module_tests(&args, m)?,
                None => Vec::new(),
            };
            Some(host_tests(&args, &filters, &mut failures))
        }
        Selection::Guests => None,
    };
    let guests = matches!(selection, Selection::Everything | Selection::Guests).then(|| {
        let guests = tier::test_executables().and_then(|exes| tier::run_all(&exes));
        if let Err(e) = &guests {
            println!("tier: the guest tier could not run: {e:#}");
        }
        guests
    });
    let mut total = match &host {
        Some(Ok(t)) => *t,
        Some(Err(_)) => Tally { failed: 1, ..Tally::default() },
        None => Tally::default(),
    };
    match &guests {
        Some(Ok(all)) => {
            for (_, t) in all {
                total.passed += t.passed;
                total.failed += t.failed;
                total.skipped += t.ignored;
            }
        }
        Some(Err(_)) => total.failed += 1,
        None => {}
    }
    if guests.is_some() {
        failures.print("host");
    }
    println!("summary: {} passed, {} failed, {} skipped", total.passed, total.failed, total.skipped);
    if let Some(host) = host {
        host?;
    }
    if let Some(guests) = guests {
        guests?;
    }
    if total.failed > 0 {
        bail!("{} failed", total.failed);
    }
    if total.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// What the host's tests counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl std::ops::Add for Tally {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self { passed: self.passed + o.passed, failed: self.failed + o.failed, skipped: self.skipped + o.skipped }
    }
}

/// `cargo test ARGS --no-fail-fast -- FILTERS` (every binary runs, so one
/// failure does not hide the rest), echoed as it runs, adding up every
/// test binary's result (the closing `summary:` line comes after the
/// guest tier, and counts a failed host run's passes too); then what each
/// failed test said (and kept in `failures`).
fn host_tests(args: &[&str], filters: &[String], failures: &mut Digest) -> anyhow::Result<Tally> {
    let mut c = crate::cargo_command();
    c.arg("test").args(args).arg("--no-fail-fast");
    if !filters.is_empty() {
        c.arg("--").args(filters);
    }
    c.stdout(Stdio::piped());
    let mut child = c.spawn().context("running cargo test")?;
    let mut tally = Tally::default();
    let mut unrun = Vec::new();
    let mut digest = Digest::default();
    for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
        let line = line?;
        println!("{line}");
        digest.line(&line);
        // A tier built by a user other than root (`limiter_tests::tier!`).
        if let Some((tier, _)) = line.strip_prefix("test ").and_then(|l| l.split_once("::needs_root ... ignored")) {
            unrun.push(tier.to_owned());
        }
        if let Some(t) = result_line(&line) {
            tally = tally + t;
        }
    }
    let st = child.wait()?;
    println!("host: {} passed, {} failed, {} skipped", tally.passed, tally.failed, tally.skipped);
    digest.print("host");
    failures.append(digest);
    if !unrun.is_empty() {
        bail!("the {} tier(s) did not run: built as a user other than root", unrun.join(", "));
    }
    // A run that failed without a failed test (a build error, a crash)
    // counts as one failure; the summary keeps what passed.
    if !st.success() && tally.failed == 0 {
        println!("host: cargo test failed: {st}");
        tally.failed = 1;
    }
    Ok(tally)
}

/// The tests of `module` in the tier binary `args` names, each exactly
/// (`--exact` and their names): a substring filter (`upstream::`) would
/// take another module's too (`adversarial::upstream::`).
fn module_tests(args: &[&str], module: &str) -> anyhow::Result<Vec<String>> {
    let out = crate::cargo_command()
        .arg("test")
        .args(args)
        .args(["--", "--list", "--format", "terse"])
        .stderr(Stdio::inherit())
        .output()
        .context("listing the tier's tests")?;
    if !out.status.success() {
        bail!("listing the tier's tests failed: {}", out.status);
    }
    let names = of_module(&String::from_utf8_lossy(&out.stdout), module);
    if names.is_empty() {
        bail!("no test in module {module}");
    }
    Ok(std::iter::once("--exact".to_owned()).chain(names).collect())
}

/// The names in a `--list --format terse` output (`NAME: test`) under
/// `module::`, from the tier's root.
fn of_module(list: &str, module: &str) -> Vec<String> {
    let prefix = format!("{module}::");
    list.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .filter(|name| name.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// The counts of a test binary's `test result:` line.
fn result_line(line: &str) -> Option<Tally> {
    let rest = line.strip_prefix("test result: ")?;
    let count = |word: &str| -> u64 {
        rest.split(';')
            .find_map(|part| part.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    Some(Tally { passed: count("passed"), failed: count("failed"), skipped: count("ignored") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_is_a_word_a_tier_or_a_module_of_one() {
        assert_eq!(Selection::parse(None).unwrap(), Selection::Everything);
        assert_eq!(Selection::parse(Some("quick")).unwrap(), Selection::Quick);
        assert_eq!(Selection::parse(Some("guests")).unwrap(), Selection::Guests);
        assert_eq!(
            Selection::parse(Some("daemon::crowdsec_bouncer")).unwrap(),
            Selection::Tier { tier: "daemon".into(), module: Some("crowdsec_bouncer".into()) }
        );
        assert_eq!(
            Selection::parse(Some("daemon::adversarial")).unwrap(),
            Selection::Tier { tier: "daemon".into(), module: Some("adversarial".into()) }
        );
        assert_eq!(Selection::parse(Some("kernel")).unwrap(), Selection::Tier { tier: "kernel".into(), module: None });
        let e = Selection::parse(Some("deamon")).unwrap_err().to_string();
        assert!(e.contains("no test selection \"deamon\"") && e.contains("kernel, daemon"), "{e}");
        let e = Selection::parse(Some("daemon::nothing_here")).unwrap_err().to_string();
        assert_eq!(e, "no module \"nothing_here\" in the daemon tier (tests/tests/daemon/)");
        assert!(Selection::parse(Some("daemon::")).is_err());
    }

    #[test]
    fn a_module_is_its_own_tests_and_not_a_namesakes_elsewhere() {
        let list = "adversarial::upstream::a: test\nupstream::b: test\nupstream::c::d: test\nupstreams::e: test\n\
                    upstream::bench: benchmark\n";
        assert_eq!(of_module(list, "upstream"), ["upstream::b", "upstream::c::d"]);
        assert_eq!(of_module(list, "adversarial::upstream"), ["adversarial::upstream::a"]);
        assert!(Selection::parse(Some("daemon::adversarial::upstream")).is_ok());
    }

    #[test]
    fn a_result_line_is_counted_and_other_lines_are_not() {
        let t =
            result_line("test result: FAILED. 111 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out").unwrap();
        assert_eq!(t, Tally { passed: 111, failed: 2, skipped: 1 });
        assert_eq!(result_line("test a ... ok"), None);
    }
}
