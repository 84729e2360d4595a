//! The kernel tier: the compiled XDP program through BPF_PROG_TEST_RUN
//! (crafted frames, an injected clock) and the verifier, no daemon.
//! Each module was a binary of its own; tests of two modules never run at
//! once (see `limiter_tests::alone`). Built by a user other than root,
//! the tier is one ignored test that says it needs root.

#![allow(
    clippy::items_after_statements,
    reason = "every test's first line takes its module's turn (`limiter_tests::alone`), before the items a test keeps to itself"
)]

limiter_tests::tier!(kernel: admission, aggregate, answers, capture, classes, deny_set, fixtures, groups, leases, overrides, syn_cookies, tcp_state, tunnel, verifier);
