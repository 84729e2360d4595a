//! The kernel tier: the compiled XDP program through BPF_PROG_TEST_RUN
//! (crafted frames, an injected clock) and the verifier, no daemon.
//! Each module was a binary of its own; tests of two modules never run at
//! once (see `limiter_tests::alone`). Built by a user other than root,
//! the tier is one ignored test that says it needs root.

#![allow(
    clippy::items_after_statements,
    reason = "every test's first line takes its module's turn (`limiter_tests::alone`), before the items a test keeps to itself"
)]

#[cfg(not(limiter_tests_need_root))]
mod admission;
#[cfg(not(limiter_tests_need_root))]
mod aggregate;
#[cfg(not(limiter_tests_need_root))]
mod classes;
#[cfg(not(limiter_tests_need_root))]
mod deny_set;
#[cfg(not(limiter_tests_need_root))]
mod fixtures;
#[cfg(not(limiter_tests_need_root))]
mod leases;
#[cfg(not(limiter_tests_need_root))]
mod overrides;
#[cfg(not(limiter_tests_need_root))]
mod syn_cookies;
#[cfg(not(limiter_tests_need_root))]
mod verifier;

/// Built by a user other than root: the tier cannot run.
#[cfg(limiter_tests_need_root)]
#[test]
#[ignore = "the kernel tier needs root: run `cargo xtask test` as root"]
fn kernel_tier_needs_root() {
    panic!("the kernel tier needs root (BPF programs, network namespaces): run `cargo xtask test` as root");
}
