//! Out-of-state TCP's daemon part: the check itself is the data plane's
//! (`limiter-ebpf`'s `state.rs`); here, run as a feature of the daemon,
//! each second says when a class's `auto` check engages and lets go (a
//! log line, a note in the attack's record), and `limiter status` lists
//! the classes it judges now.

pub mod feature;
