//! The tiers of `tests/tests` load BPF programs, make network namespaces
//! and install packages: they need root. Built by another user (a plain
//! `cargo test`), each tier is one ignored test that says so, instead of
//! tests that fail on their first step; `cargo xtask test` runs as root
//! and fails if a tier was built that way.

use std::fs;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(limiter_tests_need_root)");
    // Built again when the user changes (`sudo`, `su`).
    for var in ["USER", "SUDO_UID", "LOGNAME"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if effective_uid() != Some(0) {
        println!("cargo::rustc-cfg=limiter_tests_need_root");
        println!(
            "cargo::warning=not root: the kernel, daemon, system and guest test tiers need root and are skipped \
             (run `cargo xtask test` as root for every test)"
        );
    }
}

/// The effective user id, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().nth(1)?.parse().ok()
}
