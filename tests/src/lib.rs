//! Test harness: frame builder, kernel fixtures through BPF_PROG_TEST_RUN,
//! network namespaces with veth pairs, and the flood scenario shared by the
//! integration test and `cargo xtask demo`. Everything here needs root.

pub mod alone;
pub mod bgp;
pub mod crowdsec;
pub mod data;
pub mod feedback;
pub mod fleet;
pub mod forward;
pub mod kernel;
pub mod netns;
pub mod packet;
pub mod scenario;
pub mod seccomp;
pub mod sharing;
pub mod study;
pub mod tcp;
pub mod tunnel;

pub use alone::alone;
