//! The XDP flood guard: charge each IP packet to its source prefix's token
//! bucket and drop what exceeds it. See `limiter-common` for the arithmetic.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", expect(internal_features, reason = "atomic_cxchg is the only RMW atomic on bpf"))]

#[cfg(target_arch = "bpf")]
mod bench;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod parse;
#[cfg(target_arch = "bpf")]
mod program;

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
