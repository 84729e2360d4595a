//! SYN cookies' daemon part: keeping the kernel taking the ACKs of the
//! cookies XDP verified, and saying when it does not (`acks`), run as a
//! feature of the daemon (`feature`). The cookies themselves are the data
//! plane's (`limiter-ebpf`'s `cookie.rs`); whether a policy's cookies may
//! run on this kernel, and the TCP options they offer, the policy
//! state's (`engine::enforcer::kernel`).

mod acks;
pub mod feature;
