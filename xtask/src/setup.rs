//! What each verb needs installed, installed when missing: the build's
//! toolchain for every verb that builds, the tests' peers and tools only
//! for the tests that use them, the guests' emulator only for the guest
//! tier, the bench's peers only for the bench.

use std::process::Command;

use anyhow::Context as _;

use crate::{data, run};

/// The build: rustc-web ships precompiled `core` for the BPF target
/// (libstd-rust-web-dev-bpf) and is built on LLVM 22, which bpf-linker
/// links against (llvm-22-dev); rust-web-clippy is the clippy of that same
/// compiler, which lints the eBPF crate for its own target; libxdp is
/// linked for `--attach libxdp` (the dispatcher of libxdp1).
const BUILD: &[&str] = &["rustc-web", "libstd-rust-web-dev-bpf", "llvm-22-dev", "rust-web-clippy", "libxdp-dev"];
/// Running the daemon on network namespaces (the demo, every test that
/// loads a program).
const RUN: &[&str] = &["iproute2", "util-linux"];
/// The Debian package: dpkg-shlibdeps (dpkg-dev) and strip (binutils).
const PACKAGE: &[&str] = &["dpkg-dev", "binutils"];
/// The tests beyond the quick loop: their peers, started by the tests
/// themselves on private ports and sockets.
const TESTS: &[&str] = &[
    "systemd",
    "tmux",
    // Peers of the forwarder's tests: the tenant layer behind it.
    "haproxy",
    "nginx-light",
    // The package's tests check it with lintian, read its man pages with
    // man-db and load its completions with bash-completion.
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
    // xdp-tools, the neighbour of the sharing tests and the peer of the
    // `hit` and `deny` benches.
    "xdp-tools",
    // The upstream tests: ExaBGP, the BGP speaker the daemon drives, and
    // BIRD 2, the transit's router it peers with (neither starts a
    // service when installed; the tests start their own).
    "exabgp",
    "bird2",
    // The capture tests read the pcaps of `limiter capture` and of each
    // attack with Debian's own readers.
    "tshark",
    "tcpdump",
    // The attacks test makes a CA and a certificate for its https
    // receiver (nginx) with it.
    "openssl",
];
/// Only `bench` needs these: the netfilter peers of the system flood,
/// nginx's stream module for the forwarder's peers, perf for the system
/// flood's profile (`LIMITER_BENCH_PROFILE=1`), wrk, the HTTP load of
/// `bench forward`, and xdp-tools, the peer of `hit` and `deny`.
const BENCH: &[&str] = &["nftables", "iptables", "ethtool", "libnginx-mod-stream", "linux-perf", "wrk", "xdp-tools"];
const BPF_LINKER_VERSION: &str = "0.13.0";

/// What a verb needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Building (every verb that builds).
    Build,
    /// Building and running the daemon on network namespaces (`demo`,
    /// `test quick`).
    Run,
    /// Building the Debian package.
    Package,
    /// Every test: their peers, the tools extracted from Debian's
    /// packages, the groups' data (`setup`, `test`).
    Tests,
    /// The bench's peers (and the tests', which it starts too).
    Bench,
}

/// Install what `need` calls for and is missing.
pub fn setup(need: Need) -> anyhow::Result<()> {
    install_missing(BUILD)?;
    bpf_linker()?;
    match need {
        Need::Build => Ok(()),
        Need::Run => install_missing(RUN),
        Need::Package => install_missing(PACKAGE),
        Need::Bench => install_missing(&[RUN, TESTS, BENCH].concat()),
        Need::Tests => {
            install_missing(&[RUN, PACKAGE, TESTS].concat())?;
            extract("prometheus", PROMTOOL)?;
            extract("crowdsec", CROWDSEC)?;
            data::fetch()
        }
    }
}

pub fn install_missing(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        crate::require_root()?;
        run(apt(&["update", "-q"]))?;
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(&missing);
        run(apt(&args))?;
    }
    Ok(())
}

fn bpf_linker() -> anyhow::Result<()> {
    let have = Command::new("bpf-linker").arg("--version").output().ok().filter(|o| o.status.success());
    let current = have.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION));
    if !current {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        let mut c = crate::cargo_command();
        c.args(["install", "bpf-linker", "--locked", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .env("PATH", format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default()));
        run(c)?;
    }
    Ok(())
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
