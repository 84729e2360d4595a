//! Userspace of the XDP flood guard: policy, loader, counters and the
//! `limiter` command. The binary in `main.rs` is a thin shell over this.

pub mod cli;
pub mod control;
pub mod daemon;
pub mod loader;
pub mod metrics;
pub mod pin;
pub mod policy;
pub mod replay;
pub mod run;
pub mod stats;
pub mod top;
pub mod verbs;

/// The compiled XDP object, built by `build.rs` from `limiter-ebpf`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter.bpf.o"));
