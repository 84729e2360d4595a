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

limiter_tests::tier!(daemon: adversarial, attacks, capture, cli, control, crowdsec, crowdsec_bouncer, crowdsec_flood, ebpf_log, explain, fair_listeners, feedback, feeds, fleet, fleet_trust, forward, forward_adaptive, forward_streams, groups, history, kernel_features, metrics, netns_flood, new_sources, operator_errors, policy_memory, reflection, reload, restart, share_interface, share_restart, source_ipset, sources, syn_flood, syn_priming, tcp_state, tcp_state_forward, top, trust, tunnel, upstream);
