//! Builds the XDP object (limiter-ebpf) for `bpfel-unknown-none` so that a
//! plain `cargo build` yields a working `limiter` binary.
//!
//! Route (see ../shared/docs/toolchain.md): Debian's `rustc-web` ships a
//! precompiled `core` for the BPF targets, so no nightly and no build-std:
//! the nested cargo runs with `RUSTC=/usr/bin/rustc` and links with
//! `bpf-linker`. Override the compiler with `LIMITER_BPF_RUSTC`.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

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

    let rustc = env::var("LIMITER_BPF_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".into());
    if !Path::new(&rustc).exists() {
        bail!("{rustc} not found: the eBPF object needs Debian's rustc-web; run `cargo xtask setup`");
    }
    // A target dir of its own: the outer cargo holds the lock on ours.
    let target_dir = root.join("target").join("bpf");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root.join("limiter-ebpf"))
        .args(["build", "--release", "--locked", "--target", "bpfel-unknown-none", "-p", "limiter-ebpf"])
        .args(["--config", "target.bpfel-unknown-none.linker=\"bpf-linker\""])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTC", &rustc)
        // Only these two crates may use unstable features.
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,aya_log_ebpf,limiter_ebpf")
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2\x1f-Clink-arg=--btf");
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
    let status = cmd.status().context("running cargo for limiter-ebpf")?;
    if !status.success() {
        bail!("building limiter-ebpf failed (is bpf-linker installed? `cargo xtask setup`)");
    }
    let obj = target_dir.join("bpfel-unknown-none/release/limiter-ebpf");
    std::fs::copy(&obj, out_dir.join("limiter.bpf.o")).with_context(|| format!("copying {}", obj.display()))?;
    Ok(())
}
