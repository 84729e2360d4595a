//! `cargo xtask`: everything a fresh Debian 12 machine needs, as root.
//! Each verb installs what it needs when missing (`setup.rs`).
//!
//!   setup    install everything every verb needs
//!   build    build every binary (release)
//!   test     fmt check, clippy, every test, then the guest tier (what CI
//!            runs); `test quick`, `test unit`, `test TIER[::MODULE]`,
//!            `test guests` run a part of it (`test.rs`)
//!   package  build, then the Debian package (target/debian/*.deb)
//!   demo     flood a limiter between two namespaces and report
//!   guest    run a command in a QEMU guest of a distribution's kernel
//!   bench    measure the XDP program side by side with its peers (not
//!            part of `test`)

use std::process::Command;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use setup::{Need, install_missing, setup};
use test::Selection;

mod data;
mod digest;
mod guest;
mod package;
mod setup;
mod test;
mod tier;

#[derive(Parser)]
#[command(about = "Set-up, build, test, demo and bench of the XDP flood guard")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what every verb needs (apt packages, bpf-linker, the
    /// tests' tools and data) when missing.
    Setup,
    /// Build every binary in release mode.
    Build,
    /// Run formatting and lint checks, then every test, then the guest
    /// tier (the kernel-facing tests in a QEMU guest of each distribution
    /// kernel users run); or a part of it.
    Test {
        /// What to run: everything when none is given (what CI runs);
        /// `quick` (fmt, clippy, the unit tests and the kernel tier on the
        /// host), `unit`, a tier (`kernel`, `daemon`, `system`, `guest`)
        /// or one module of it (`daemon::crowdsec_bouncer`), or `guests`
        /// (the guest tier alone).
        what: Option<String>,
        /// Skip `cargo fmt --check` and `cargo clippy`.
        #[arg(long)]
        no_lint: bool,
        /// The guest tier alone (as `test guests`).
        #[arg(long, conflicts_with = "what")]
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
        /// Run only these sections (hit, tcp-state, system,
        /// system-tcp-state, accuracy, working-sets, overrides, metrics,
        /// verifier, forward, ...); all when none is given.
        sections: Vec<String>,
    },
}

/// An error is one line (its causes after colons), never a backtrace.
fn main() -> std::process::ExitCode {
    match verb(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn verb(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Setup => setup(Need::Tests).and_then(|()| install_missing(guest::PACKAGES)),
        Cmd::Build => {
            setup(Need::Build)?;
            cargo(&["build", "--release", "--bins"])
        }
        Cmd::Test { what, no_lint, only_kernels } => {
            let selection = if only_kernels { Selection::Guests } else { Selection::parse(what.as_deref())? };
            test::run(&selection, no_lint)
        }
        Cmd::Guest { release, command } => {
            require_root()?;
            setup(Need::Build)?;
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
            setup(Need::Package)?;
            cargo(&["build", "--release", "--bin", "limiter"])?;
            let deb = package::package(std::path::Path::new("target/release/limiter"), revision)?;
            println!("{}", deb.display());
            Ok(())
        }
        Cmd::Demo => {
            require_root()?;
            setup(Need::Run)?;
            cargo(&["build", "--release", "--bins"])?;
            run(Command::new("target/release/demo"))
        }
        Cmd::Bench { sections } => {
            require_root()?;
            setup(Need::Bench)?;
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
pub(crate) fn clippy_ebpf() -> anyhow::Result<()> {
    let mut c = Command::new("/usr/bin/cargo-clippy");
    c.current_dir("limiter-ebpf")
        .args(["clippy", "--release", "--locked", "--target", "bpfel-unknown-none", "--features", "bench"])
        .args(["--target-dir", "../target/bpf-clippy", "--", "-D", "warnings"])
        .env("RUSTC", "/usr/bin/rustc")
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,aya_log_ebpf,limiter_ebpf")
        .env_remove("RUSTFLAGS");
    run(c)
}

pub(crate) fn require_root() -> anyhow::Result<()> {
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

/// The cargo that runs xtask (`$CARGO`), or the one on the path.
pub(crate) fn cargo_command() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub(crate) fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let mut c = cargo_command();
    c.args(args);
    run(c)
}
