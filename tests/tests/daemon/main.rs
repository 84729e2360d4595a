//! The daemon tier: `limiter run` on a veth pair between network
//! namespaces, with real traffic and real peers (a tenant layer, Redis,
//! CrowdSec's LAPI, xdp-tools), and the operator's commands against it.
//! Each module was a binary of its own; tests of two modules never run at
//! once (see `limiter_tests::alone`). Built by a user other than root,
//! the tier is one ignored test that says it needs root.

#![allow(
    clippy::items_after_statements,
    reason = "every test's first line takes its module's turn (`limiter_tests::alone`), before the items a test keeps to itself"
)]

#[cfg(not(limiter_tests_need_root))]
mod adversarial;
#[cfg(not(limiter_tests_need_root))]
mod cli;
#[cfg(not(limiter_tests_need_root))]
mod control;
#[cfg(not(limiter_tests_need_root))]
mod crowdsec;
#[cfg(not(limiter_tests_need_root))]
mod crowdsec_bouncer;
#[cfg(not(limiter_tests_need_root))]
mod crowdsec_flood;
#[cfg(not(limiter_tests_need_root))]
mod ebpf_log;
#[cfg(not(limiter_tests_need_root))]
mod fair_listeners;
#[cfg(not(limiter_tests_need_root))]
mod feedback;
#[cfg(not(limiter_tests_need_root))]
mod feeds;
#[cfg(not(limiter_tests_need_root))]
mod fleet;
#[cfg(not(limiter_tests_need_root))]
mod fleet_trust;
#[cfg(not(limiter_tests_need_root))]
mod forward;
#[cfg(not(limiter_tests_need_root))]
mod forward_adaptive;
#[cfg(not(limiter_tests_need_root))]
mod forward_streams;
#[cfg(not(limiter_tests_need_root))]
mod kernel_features;
#[cfg(not(limiter_tests_need_root))]
mod metrics;
#[cfg(not(limiter_tests_need_root))]
mod netns_flood;
#[cfg(not(limiter_tests_need_root))]
mod new_sources;
#[cfg(not(limiter_tests_need_root))]
mod operator_errors;
#[cfg(not(limiter_tests_need_root))]
mod policy_memory;
#[cfg(not(limiter_tests_need_root))]
mod reload;
#[cfg(not(limiter_tests_need_root))]
mod restart;
#[cfg(not(limiter_tests_need_root))]
mod share_interface;
#[cfg(not(limiter_tests_need_root))]
mod share_restart;
#[cfg(not(limiter_tests_need_root))]
mod syn_flood;
#[cfg(not(limiter_tests_need_root))]
mod syn_priming;
#[cfg(not(limiter_tests_need_root))]
mod top;
#[cfg(not(limiter_tests_need_root))]
mod trust;

/// Built by a user other than root: the tier cannot run.
#[cfg(limiter_tests_need_root)]
#[test]
#[ignore = "the daemon tier needs root: run `cargo xtask test` as root"]
fn daemon_tier_needs_root() {
    panic!("the daemon tier needs root (BPF programs, network namespaces): run `cargo xtask test` as root");
}
