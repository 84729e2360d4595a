//! `cargo xtask`: everything a fresh Debian 12 machine needs, as root.
//!
//!   setup  install the apt packages and bpf-linker when missing
//!   build  setup, then build every binary (release)
//!   test   setup, fmt check, clippy, then every test (needs root)
//!   package  setup, build, then the Debian package (target/debian/*.deb)
//!   demo   setup, then flood a limiter between two namespaces and report
//!   bench  setup (plus nftables, iptables), then measure the XDP program
//!          side by side with its peers (not part of `test`)

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use digest::Digest;

mod data;
mod digest;
mod guest;
mod package;
mod tier;

/// Debian packages: rustc-web ships precompiled `core` for the BPF target
/// (libstd-rust-web-dev-bpf) and is built on LLVM 22, which bpf-linker
/// links against (llvm-22-dev); rust-web-clippy is the clippy of that same
/// compiler, which lints the eBPF crate for its own target.
const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "rust-web-clippy",
    "iproute2",
    "util-linux",
    "systemd",
    "tmux",
    // Peers of the forwarder's tests: the tenant layer behind it.
    "haproxy",
    "nginx-light",
    // The Debian package: dpkg-shlibdeps (dpkg-dev) and strip (binutils)
    // build it; its tests check it with lintian, read its man pages with
    // man-db and load its completions with bash-completion.
    "dpkg-dev",
    "binutils",
    "lintian",
    "man-db",
    "bash-completion",
    // The fleet's shared store (redis-server, and redis-cli to form a
    // Redis Cluster), started by the fleet tests on private sockets.
    "redis-server",
    // The fleet's clock test runs one node 5 s ahead (libfaketime).
    "faketime",
    // The upgrade test makes an older build's pinned map with it.
    "bpftool",
    // libxdp, linked for `--attach libxdp` (the dispatcher of libxdp1),
    // and xdp-tools, the neighbour of the sharing tests and the peer of
    // the `hit` and `deny` benches.
    "libxdp-dev",
    "xdp-tools",
    // The upstream tests: ExaBGP, the BGP speaker the daemon drives, and
    // BIRD 2, the transit's router it peers with (neither starts a
    // service when installed; the tests start their own).
    "exabgp",
    "bird2",
];
/// Only `bench` needs these: the netfilter peers of the system flood,
/// nginx's stream module for the forwarder's peers, perf for the system
/// flood's profile (`LIMITER_BENCH_PROFILE=1`), and wrk, the HTTP load of
/// `bench forward`.
const BENCH_PACKAGES: &[&str] = &["nftables", "iptables", "ethtool", "libnginx-mod-stream", "linux-perf", "wrk"];
const BPF_LINKER_VERSION: &str = "0.13.0";

#[derive(Parser)]
#[command(about = "Set-up, build, test, demo and bench of the XDP flood guard")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build needs (apt packages, bpf-linker) when missing.
    Setup,
    /// Build every binary in release mode.
    Build,
    /// Run formatting and lint checks, then every test, then the kernel
    /// tier (the kernel-facing tests in a QEMU guest of each distribution
    /// kernel users run).
    Test {
        /// Skip `cargo fmt --check` and `cargo clippy`.
        #[arg(long)]
        no_lint: bool,
        /// Run only the guest tier (for work on it; the full command runs
        /// everything).
        #[arg(long)]
        only_kernels: bool,
    },
    /// Run a command in a QEMU guest of a distribution's stock kernel,
    /// with this machine's files visible (read-only, writes kept in the
    /// guest's memory): `cargo xtask guest bookworm -- target/release/limiter --version`.
    Guest {
        /// Debian's codename of the kernel's release (bookworm: Debian 12,
        /// trixie: Debian 13).
        release: String,
        /// The command line, run by bash in the current directory.
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Build the Debian package: target/debian/limiter_VERSION-REVISION_ARCH.deb.
    Package {
        /// The Debian revision (the package's version is the crate's,
        /// then `-REVISION`).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        revision: u32,
    },
    /// Flood a limiter between two namespaces and print what passed and dropped.
    Demo,
    /// Measure the XDP program side by side with a bare XDP_DROP, nftables
    /// and iptables.
    Bench {
        /// Run only these sections (hit, system, accuracy, working-sets,
        /// overrides, metrics, verifier, forward); all when none is given.
        sections: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    setup()?;
    match cli.cmd {
        Cmd::Setup => Ok(()),
        Cmd::Build => cargo(&["build", "--release", "--bins"]),
        Cmd::Test { no_lint, only_kernels } => {
            require_root()?;
            install_missing(guest::PACKAGES)?;
            if !no_lint && !only_kernels {
                cargo(&["fmt", "--all", "--", "--check"])?;
                cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
                clippy_ebpf()?;
            }
            // Integration tests run the `limiter` binary itself.
            cargo(&["build", "--bins"])?;
            let host = if only_kernels { Ok(Tally::default()) } else { test_with_summary() };
            // The guest tier runs even when a host test failed: its
            // report says what works on which kernel.
            let exes = tier::test_executables()?;
            let guests = tier::run_all(&exes);
            let mut total = host.as_ref().map_or_else(|_| Tally { failed: 1, ..Tally::default() }, |t| *t);
            match &guests {
                Ok(all) => {
                    for (_, t) in all {
                        total.passed += t.passed;
                        total.failed += t.failed;
                        total.skipped += t.ignored;
                    }
                }
                Err(e) => {
                    println!("tier: the guest tier could not run: {e:#}");
                    total.failed += 1;
                }
            }
            println!("summary: {} passed, {} failed, {} skipped", total.passed, total.failed, total.skipped);
            host?;
            guests?;
            if total.failed > 0 {
                bail!("{} failed", total.failed);
            }
            if total.passed == 0 {
                bail!("no test ran");
            }
            Ok(())
        }
        Cmd::Guest { release, command } => {
            require_root()?;
            install_missing(guest::PACKAGES)?;
            let r = guest::RELEASES
                .iter()
                .chain([&guest::OLDER])
                .find(|r| r.codename == release)
                .with_context(|| format!("no kernel release {release:?} (bookworm, trixie, bullseye)"))?;
            let k = guest::fetch(*r)?;
            let out = guest::run(&k, &command.join(" "), std::time::Duration::from_hours(1), |l| println!("{l}"))?;
            match out.status {
                Some(0) => Ok(()),
                Some(st) => std::process::exit(st),
                None => bail!("the guest timed out"),
            }
        }
        Cmd::Package { revision } => {
            cargo(&["build", "--release", "--bin", "limiter"])?;
            let deb = package::package(std::path::Path::new("target/release/limiter"), revision)?;
            println!("{}", deb.display());
            Ok(())
        }
        Cmd::Demo => {
            require_root()?;
            cargo(&["build", "--release", "--bins"])?;
            run(Command::new("target/release/demo"))
        }
        Cmd::Bench { sections } => {
            require_root()?;
            install_missing(BENCH_PACKAGES)?;
            cargo(&["build", "--release", "--bins"])?;
            let mut bench = Command::new("target/release/bench");
            bench.args(sections);
            run(bench)
        }
    }
}

/// Clippy over the eBPF crate for its own target (production and bench
/// programs), with Debian's clippy, which matches the compiler that builds
/// it (host clippy never sees this code: it is `cfg(target_arch = "bpf")`).
fn clippy_ebpf() -> anyhow::Result<()> {
    let mut c = Command::new("/usr/bin/cargo-clippy");
    c.current_dir("limiter-ebpf")
        .args(["clippy", "--release", "--locked", "--target", "bpfel-unknown-none", "--features", "bench"])
        .args(["--target-dir", "../target/bpf-clippy", "--", "-D", "warnings"])
        .env("RUSTC", "/usr/bin/rustc")
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,aya_log_ebpf,limiter_ebpf")
        .env_remove("RUSTFLAGS");
    run(c)
}

fn require_root() -> anyhow::Result<()> {
    let out = Command::new("id").arg("-u").output().context("running id -u")?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        bail!("this needs root (it loads XDP programs and creates network namespaces)");
    }
    Ok(())
}

pub(crate) fn run(mut cmd: Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd.status().with_context(|| format!("running {shown}"))?;
    if !st.success() {
        bail!("{shown} failed: {st}");
    }
    Ok(())
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args);
    run(c)
}

/// What the host's tests counted.
#[derive(Clone, Copy, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

/// `cargo test --workspace --no-fail-fast` (every binary runs, so one
/// failure does not hide the rest), echoed as it runs, adding up every test
/// binary's result (the closing `summary:` line comes after the guest
/// tier, and counts a failed host run's passes too).
fn test_with_summary() -> anyhow::Result<Tally> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(["test", "--workspace", "--no-fail-fast"]).stdout(Stdio::piped());
    let mut child = c.spawn().context("running cargo test")?;
    let (mut passed, mut failed, mut skipped) = (0u64, 0u64, 0u64);
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
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
            skipped += count("ignored");
        }
    }
    let st = child.wait()?;
    println!("host: {passed} passed, {failed} failed, {skipped} skipped");
    digest.print("host");
    if !unrun.is_empty() {
        bail!("the {} tier(s) did not run: built as a user other than root", unrun.join(", "));
    }
    // A run that failed without a failed test (a build error, a crash)
    // counts as one failure; the summary keeps what passed.
    if !st.success() && failed == 0 {
        println!("host: cargo test failed: {st}");
        failed = 1;
    }
    Ok(Tally { passed, failed, skipped })
}

fn install_missing(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        require_root()?;
        run(apt(&["update", "-q"]))?;
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(&missing);
        run(apt(&args))?;
    }
    Ok(())
}

fn setup() -> anyhow::Result<()> {
    install_missing(APT_PACKAGES)?;
    let have = Command::new("bpf-linker").arg("--version").output().ok().filter(|o| o.status.success());
    let current = have.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION));
    if !current {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        c.args(["install", "bpf-linker", "--locked", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .env("PATH", format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default()));
        run(c)?;
    }
    extract("prometheus", PROMTOOL)?;
    extract("crowdsec", CROWDSEC)?;
    data::fetch()
}

/// Where setup puts Debian's `promtool` (the tests check the alert rules
/// with it): extracted from the `prometheus` package, which is not
/// installed (its postinst would start a Prometheus server on the host).
pub const PROMTOOL: &str = "target/tools/prometheus/usr/bin/promtool";
/// Where setup puts Debian's `crowdsec` and `cscli` (the tests run a real
/// Local API with them): extracted, never installed, since the package's
/// postinst registers with CrowdSec's central API, which fails without
/// the internet and leaves dpkg half configured.
pub const CROWDSEC: &str = "target/tools/crowdsec/usr/bin/crowdsec";

/// Extract Debian's package `pkg` under `target/tools/PKG` unless `probe`
/// (a file it holds) is there already.
fn extract(pkg: &str, probe: &str) -> anyhow::Result<()> {
    if std::path::Path::new(probe).exists() {
        return Ok(());
    }
    eprintln!("xtask: extracting Debian's {pkg} package (not installing it)");
    let dl = std::path::Path::new("target/tools/download");
    std::fs::create_dir_all(dl)?;
    let mut get = apt(&["download", pkg]);
    get.current_dir(dl);
    if run(get).is_err() {
        run(apt(&["update", "-q"]))?;
        let mut get = apt(&["download", pkg]);
        get.current_dir(dl);
        run(get)?;
    }
    let deb = std::fs::read_dir(dl)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pkg}_"))))
        .with_context(|| format!("apt-get download {pkg} left no .deb"))?;
    let mut x = Command::new("dpkg-deb");
    x.arg("-x").arg(&deb).arg(format!("target/tools/{pkg}"));
    run(x)?;
    std::fs::remove_file(deb)?;
    Ok(())
}

fn apt(args: &[&str]) -> Command {
    let mut c = Command::new("apt-get");
    c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    c
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}
