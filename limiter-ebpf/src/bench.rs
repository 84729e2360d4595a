//! Programs for `cargo xtask bench` only, built into the bench object (the
//! `bench` feature); the production object never holds them.
//!
//! The system flood (bench b) uses BPF_PROG_TEST_RUN in live-frames mode
//! as a NIC-like packet generator: the generator program runs once per
//! frame inside the sender namespace and returns `XDP_TX`, which sends the
//! frame out of the sender's veth; it reaches the receiving veth as an
//! `xdp_frame`, with no socket buffer built unless the receiver's XDP
//! program passes it. Frames persist between runs in live mode, so a
//! rewrite here is what the next run starts from.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns},
    macros::xdp,
    programs::XdpContext,
};
use limiter_common::{BucketKey, family, gcra};

use crate::{
    atomic::{Cas, charge_existing},
    maps::{BUCKETS, STATS},
};

/// Bench baseline: the cheapest possible XDP program, for ratios.
#[xdp]
pub fn baseline_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

/// The bucket [`bench_floor`] charges: 198.18.5.0/24, class 0, the prefix
/// of the bench's hit-path frame (the bench creates it first).
const FLOOR_KEY: BucketKey = BucketKey {
    family: family::IPV4,
    prefix_len: 24,
    class: 0,
    pad: 0,
    addr: [u32::from_ne_bytes([198, 18, 5, 0]), 0],
};

/// Bench floor: what any exact bucket shared by all CPUs costs per packet
/// whatever else a program does, with nothing else: read the coarse clock,
/// look the bucket up in the shared LRU map, charge it with one
/// compare-and-swap, count the packet in one per-CPU counter. No parsing,
/// no policy, a fixed key.
#[xdp]
pub fn bench_floor(_ctx: XdpContext) -> u32 {
    // SAFETY: a BPF helper with no arguments.
    let now = gcra::to_fixed(unsafe { bpf_ktime_get_coarse_ns() });
    let Some(p) = BUCKETS.get_ptr_mut(FLOOR_KEY) else { return xdp_action::XDP_ABORTED };
    if charge_existing(p, now, 1, u64::MAX >> 2) != Cas::Done {
        return xdp_action::XDP_ABORTED;
    }
    if let Some(c) = STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU's softirq writes it.
        unsafe { (*c).packets += 1 };
    }
    xdp_action::XDP_DROP
}

/// Bench receiver: read the IPv4 source address, then drop. The least any
/// filter that looks at a packet pays: on a receiver whose frames come
/// from another core, that first read of the header is a cache miss which
/// a bare `XDP_DROP` never takes.
#[xdp]
pub fn bench_touch_drop(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + IP + IP_HDR > end {
        return xdp_action::XDP_ABORTED;
    }
    // SAFETY: the 4 bytes at offset 12 of the IPv4 header are inside the
    // bounds checked above.
    let src = unsafe { core::ptr::read_unaligned((start + IP + 12) as *const u32) };
    if src == 0 { xdp_action::XDP_PASS } else { xdp_action::XDP_DROP }
}

/// Receiver for the netfilter rows: a veth only accepts `xdp_frame`s when
/// an XDP program is attached, so this one hands every frame to the stack.
#[xdp]
pub fn bench_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// Generator: send the frame unchanged (a flood from one source).
#[xdp]
pub fn bench_tx(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_TX
}

/// Ethernet header, then the IPv4 header.
const IP: usize = 14;
const IP_HDR: usize = 20;

/// Generator: give each frame a random IPv4 source in 198.19.0.0/16 (256
/// /24 prefixes, 65,536 addresses), fix the header checksum and send it.
/// The frame must be Ethernet + IPv4 without options.
#[xdp]
pub fn bench_tx_spread(ctx: XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + IP + IP_HDR > end {
        return xdp_action::XDP_ABORTED;
    }
    let ip = (start + IP) as *mut u8;
    // SAFETY: a BPF helper with no arguments.
    let [a, b, _, _] = unsafe { bpf_get_prandom_u32() }.to_le_bytes();
    // SAFETY: every offset below is inside the 20 bytes checked above.
    unsafe {
        *ip.add(12) = 198;
        *ip.add(13) = 19;
        *ip.add(14) = a;
        *ip.add(15) = b;
        *ip.add(10) = 0;
        *ip.add(11) = 0;
        let mut sum = 0u32;
        for i in 0..IP_HDR / 2 {
            sum += u32::from(u16::from_be_bytes([*ip.add(2 * i), *ip.add(2 * i + 1)]));
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        #[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits above")]
        let [hi, lo] = (!(sum as u16)).to_be_bytes();
        *ip.add(10) = hi;
        *ip.add(11) = lo;
    }
    xdp_action::XDP_TX
}

/// Test flood generator's own interface: drop what comes back to the
/// spoofed sources of `netload spoof-syn` (IPv4 198.18.4.0-198.19.255.255,
/// IPv6 2001:2:100::/40) at once, pass the rest. Like a real attacker,
/// the generator then never processes the SYN-ACKs its flood draws, and
/// the real clients beside it see their own replies.
#[xdp]
pub fn bench_drop_flood_replies(ctx: XdpContext) -> u32 {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + 54 > end {
        return xdp_action::XDP_PASS;
    }
    // SAFETY: the 54 bytes at data are inside the packet.
    let f = unsafe { &*(data as *const [u8; 54]) };
    let spoofed = match [f[12], f[13]] {
        [0x08, 0x00] => f[30] == 198 && (f[31] == 19 || (f[31] == 18 && f[32] >= 4)),
        [0x86, 0xdd] => f[38..43] == [0x20, 0x01, 0x00, 0x02, 0x01],
        _ => false,
    };
    if spoofed { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS }
}
