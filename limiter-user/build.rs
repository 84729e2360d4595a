//! Builds the XDP object (limiter-ebpf) for `bpfel-unknown-none` so that a
//! plain `cargo build` yields a working `limiter` binary, and beside it
//! the object without SYN cookies (limiter-ebpf's `without-syn-cookies`
//! feature, for kernels without their helpers); with the `testing`
//! feature also the bench object (limiter-ebpf's `bench` feature: the
//! production programs plus the bench's own).
//!
//! Route: Debian's `rustc-web` ships a precompiled `core` for the BPF
//! targets, so no nightly and no build-std: the nested cargo runs with
//! `RUSTC=/usr/bin/rustc` and links with `bpf-linker` (see docs/operations.md,
//! "Building on other distributions"). Override the compiler with
//! `LIMITER_BPF_RUSTC`. `LIMITER_BUILD_SKIP=1` skips the eBPF build and
//! embeds empty objects (for `cargo check`, docs and IDEs on machines
//! without the toolchain; such a binary cannot load anything). The eBPF
//! compiler's warnings are passed on as `cargo:warning` lines.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// The objects built, and limiter-ebpf's features for each: the
/// production object, the one for kernels without the raw SYN cookie
/// helpers, and (with the `testing` feature only, so last) the bench's.
const OBJECTS: [(&str, &[&str]); 3] = [
    ("limiter.bpf.o", &[]),
    ("limiter-without-syn-cookies.bpf.o", &["--features", "without-syn-cookies"]),
    ("limiter-bench.bpf.o", &["--features", "bench"]),
];

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir.parent().context("workspace root")?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    for p in
        ["limiter-ebpf/src", "limiter-ebpf/Cargo.toml", "limiter-common/src", "limiter-common/Cargo.toml", "Cargo.lock"]
    {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=LIMITER_BPF_RUSTC");
    git_revision(root);
    println!("cargo:rerun-if-env-changed=LIMITER_BUILD_SKIP");
    let bench = env::var_os("CARGO_FEATURE_TESTING").is_some();
    let wanted = if bench { &OBJECTS[..] } else { &OBJECTS[..2] };

    if env::var("LIMITER_BUILD_SKIP").is_ok_and(|v| v == "1" || v == "true") {
        println!("cargo:warning=LIMITER_BUILD_SKIP: the XDP object is empty; this binary cannot load it");
        for (name, _) in wanted {
            std::fs::write(out_dir.join(name), []).with_context(|| format!("writing {name}"))?;
        }
        return Ok(());
    }
    let rustc = env::var("LIMITER_BPF_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".into());
    if !Path::new(&rustc).exists() {
        bail!("{rustc} not found: the eBPF object needs Debian's rustc-web; run `cargo xtask setup`");
    }
    // A target dir of its own: the outer cargo holds the lock on ours.
    let target_dir = root.join("target").join("bpf");
    for (name, features) in wanted {
        build_object(root, &rustc, &target_dir, features)?;
        let obj = target_dir.join("bpfel-unknown-none/release/limiter-ebpf");
        std::fs::copy(&obj, out_dir.join(name)).with_context(|| format!("copying {}", obj.display()))?;
    }
    Ok(())
}

/// `LIMITER_GIT_REV` for `limiter --version` and `limiter_build_info`: the
/// commit the tree was built from (`git rev-parse --short=12 HEAD`), with
/// `-dirty` when tracked files differ from it; `LIMITER_GIT_REV` in the
/// environment wins (a build from a source tarball has no `.git`), and
/// `unknown` when neither tells.
fn git_revision(root: &Path) {
    println!("cargo:rerun-if-env-changed=LIMITER_GIT_REV");
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rev = env::var("LIMITER_GIT_REV").ok().filter(|r| !r.is_empty()).or_else(|| {
        let head = git(&["rev-parse", "--short=12", "HEAD"])?;
        // Rebuilt when HEAD moves or the index changes (a commit, a checkout,
        // `git add`); an edit alone to a tracked file is not seen until then.
        let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).unwrap_or_default();
        for p in ["HEAD", "index", branch.as_str()] {
            let path = git(&["rev-parse", "--git-path", p]).map(|path| root.join(path));
            // Only files that exist: a missing one would rerun this every build.
            if let Some(path) = path.filter(|path| !p.is_empty() && path.is_file()) {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        Some(if dirty { format!("{head}-dirty") } else { head })
    });
    println!("cargo:rustc-env=LIMITER_GIT_REV={}", rev.unwrap_or_else(|| "unknown".into()));
}

/// `cargo build` of limiter-ebpf for the BPF target with `features`.
fn build_object(root: &Path, rustc: &str, target_dir: &Path, features: &[&str]) -> anyhow::Result<()> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root.join("limiter-ebpf"))
        .args(["build", "--release", "--locked", "--target", "bpfel-unknown-none", "-p", "limiter-ebpf"])
        .args(features)
        .args(["--config", "target.bpfel-unknown-none.linker=\"bpf-linker\""])
        .arg("--target-dir")
        .arg(target_dir)
        .env("RUSTC", rustc)
        // Only these crates may use unstable features.
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,aya_log_ebpf,limiter_ebpf")
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2\x1f-Clink-arg=--btf")
        .env("CARGO_TERM_COLOR", "never");
    for (k, _) in env::vars() {
        // Outer-build settings that must not leak into the BPF build.
        if k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || [
                "RUSTC_WRAPPER",
                "RUSTC_WORKSPACE_WRAPPER",
                "RUSTFLAGS",
                "CARGO_BUILD_TARGET",
                "CARGO_TARGET_DIR",
                "CARGO_MAKEFLAGS",
                "RUSTDOC",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.output().context("running cargo for limiter-ebpf")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    relay_warnings(&stderr);
    if !out.status.success() {
        eprintln!("{stderr}");
        bail!("building limiter-ebpf {features:?} failed (is bpf-linker installed? `cargo xtask setup`)");
    }
    Ok(())
}

/// Each compiler warning as one `cargo:warning` line: the message and
/// where it points.
fn relay_warnings(stderr: &str) {
    let mut lines = stderr.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(msg) = line.strip_prefix("warning: ") else { continue };
        // Cargo's own tally ("`limiter-ebpf` (bin ...) generated 2 warnings").
        if msg.contains("generated ") && msg.contains(" warning") {
            continue;
        }
        let at = lines.peek().and_then(|l| l.trim_start().strip_prefix("--> ")).map(str::to_owned);
        match at {
            Some(at) => println!("cargo:warning=limiter-ebpf: {msg} ({at})"),
            None => println!("cargo:warning=limiter-ebpf: {msg}"),
        }
    }
}
