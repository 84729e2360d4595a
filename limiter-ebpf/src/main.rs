//! The XDP flood guard: charge each IP packet to its source prefix's token
//! bucket and drop what exceeds it. The parser, rule classes, prefix
//! masking and GCRA arithmetic are pure code in `limiter-common`; this
//! crate is the glue over the maps: `charge` (buckets, budgets), `resolve`
//! (overrides, then the deny set of `deny`),
//! `count` (counters, drop sampling), `answer` (a refused answer to a
//! socket this host connected), `packed` (the scalars the global
//! functions take in one word), `lease` (per-CPU leases of a
//! bucket's credit and cached refusals), `window` (window quotas),
//! `cookie` (SYN cookies; not in the object built with the
//! `without-syn-cookies` feature), `tunnel` (forwarding at the driver). At the bottom, imported by the rest and
//! importing none of it: `maps`, `packet` (the frame under XDP) and
//! `atomic` (compare-and-swap and the bucket steps built on it). See
//! `docs/design.md` for the invariants cited in comments.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", expect(internal_features, reason = "atomic_cxchg is the only RMW atomic on bpf"))]
// Every helper is inlined into the entry points: a BPF-to-BPF call would
// lose the verifier's knowledge of packet bounds and cost a call each.
#![cfg_attr(target_arch = "bpf", expect(clippy::inline_always, reason = "hot-path helpers of the XDP program"))]
// `#[xdp]` entry points take their context by value.
#![cfg_attr(target_arch = "bpf", expect(clippy::needless_pass_by_value, reason = "the #[xdp] signature"))]

#[cfg(target_arch = "bpf")]
mod answer;
#[cfg(target_arch = "bpf")]
mod atomic;
#[cfg(all(target_arch = "bpf", feature = "bench"))]
mod bench;
#[cfg(target_arch = "bpf")]
mod chain;
#[cfg(target_arch = "bpf")]
mod charge;
// Left out of the object built without SYN cookies (for kernels without
// the raw SYN cookie helpers: every global function is verified, used or
// not, so their calls cannot stay in).
#[cfg(all(target_arch = "bpf", not(feature = "without-syn-cookies")))]
mod cookie;
#[cfg(target_arch = "bpf")]
mod count;
#[cfg(target_arch = "bpf")]
mod deny;
#[cfg(target_arch = "bpf")]
mod groups;
#[cfg(target_arch = "bpf")]
mod held;
#[cfg(target_arch = "bpf")]
mod job;
#[cfg(target_arch = "bpf")]
mod lease;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod packed;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod program;
#[cfg(target_arch = "bpf")]
mod resolve;
#[cfg(target_arch = "bpf")]
mod state;
#[cfg(target_arch = "bpf")]
mod tunnel;
#[cfg(target_arch = "bpf")]
mod window;

/// Host builds (`cargo build --workspace`) get an empty binary; the real
/// object is built for `bpfel-unknown-none` by limiter-user's build.rs.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path; this is never called.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
