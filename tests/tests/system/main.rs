//! The system tier: what ships beside the binary, on the system: the
//! Debian package, the systemd unit, the alert rules, offline replay.
//! Each module was a binary of its own; tests of two modules never run at
//! once (see `limiter_tests::alone`). Built by a user other than root,
//! the tier is one ignored test that says it needs root.

#![allow(
    clippy::items_after_statements,
    reason = "every test's first line takes its module's turn (`limiter_tests::alone`), before the items a test keeps to itself"
)]

limiter_tests::tier!(system: alerts, groups, package, replay, systemd);
