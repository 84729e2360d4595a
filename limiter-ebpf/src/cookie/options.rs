//! The options of a client's SYN, read for its cookie SYN-ACK: MSS,
//! window scale, SACK permitted and the timestamp value.

use core::ptr::read_volatile;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use limiter_common::packet::Frame as _;

use crate::packet::Packet;

/// What a client's SYN asked for in its options.
#[derive(Clone, Copy)]
pub(super) struct ClientOptions {
    /// 0: no MSS option.
    pub mss: u16,
    /// [`NO_WSCALE`]: no window scale option.
    pub wscale: u8,
    pub sack: bool,
    /// The timestamp option's value, if there was one.
    pub tsval: Option<u32>,
}

impl ClientOptions {
    /// From [`limiter_syn_options`]'s answer.
    #[inline(always)]
    #[expect(clippy::cast_possible_truncation, reason = "fields of the packed word")]
    pub(super) fn unpack(w: u64) -> Self {
        Self {
            mss: w as u16,
            wscale: (w >> 16) as u8,
            sack: w & 1 << 24 != 0,
            tsval: (w & 1 << 25 != 0).then_some((w >> 32) as u32),
        }
    }
}

/// The options of the SYN whose TCP header is at `l4` (at most 62), packed:
/// MSS | window scale << 16 | SACK << 24 | timestamp seen << 25 | its value
/// << 32. A global function, checked once on its own, with a stack frame
/// of its own (its walk needs one).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_syn_options(ctx: *mut xdp_md, l4: u64) -> u64 {
    let xdp = XdpContext::new(ctx);
    let pkt = &Packet(&xdp);
    if l4 > 62 {
        return u64::from(NO_WSCALE) << 16;
    }
    #[expect(clippy::cast_possible_truncation, reason = "l4 <= 62")]
    let l4 = l4 as usize;
    let Some(th) = pkt.bytes_at::<20>(l4) else { return u64::from(NO_WSCALE) << 16 };
    client_options(pkt, l4, th[12] >> 4)
}

pub(super) const NO_WSCALE: u8 = 0xff;
/// Bytes of options a TCP header holds at most.
const MAX_OPTIONS: usize = 40;

/// Read the SYN's options (`doff` words of header at `l4`), packed as
/// [`limiter_syn_options`] answers. A malformed list ends the walk with
/// what was read before it. The options are copied to the stack word by
/// word first, and then walked position by position, each position checked
/// against where the next option starts: every access is at a fixed offset
/// and the walk's state is two numbers, which keeps the verifier's work
/// and the stack small (a loop by variable offsets multiplied the
/// verifier's states past its limit).
#[inline(always)]
fn client_options(pkt: &Packet, l4: usize, doff: u8) -> u64 {
    let len = (usize::from(doff & 0x0f) * 4).saturating_sub(20);
    // Room for an option's fields read past the last position.
    let mut b = [0u8; MAX_OPTIONS + 8];
    for w in 0..MAX_OPTIONS / 4 {
        if 4 * w >= len {
            break;
        }
        let Some(word) = pkt.bytes_at::<4>(l4 + 20 + 4 * w) else { break };
        b[4 * w..4 * w + 4].copy_from_slice(word);
    }
    let mut acc = u64::from(NO_WSCALE) << 16;
    let mut next = 0;
    // One step per position, each with its offsets fixed at compile time.
    macro_rules! walk {
        ($($p:literal)*) => { $( step::<$p>(&b, len, &mut next, &mut acc); )* };
    }
    walk!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39);
    acc
}

/// The walk at position `P` of the options `b` (`len` bytes): if an
/// option starts here, read it into `acc` and say where the next one
/// starts. The buffer is read with volatile loads, so that the compiler
/// does not hoist all of them ahead of the walk and spill them.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "size is a byte")]
fn step<const P: usize>(b: &[u8; MAX_OPTIONS + 8], len: usize, next: &mut usize, acc: &mut u64) {
    if P != *next || P >= len {
        return;
    }
    // SAFETY: in-bounds reads of a local array.
    let at = |i: usize| u64::from(unsafe { read_volatile(&raw const b[i]) });
    let (kind, size) = (at(P), at(P + 1));
    *next = match kind {
        0 => MAX_OPTIONS,
        1 => P + 1,
        _ if size < 2 || P + size as usize > len => MAX_OPTIONS,
        _ => {
            match (kind, size) {
                (2, 4) => *acc = (*acc & !0xffff) | at(P + 2) << 8 | at(P + 3),
                (3, 3) => *acc = (*acc & !(0xff << 16)) | at(P + 2) << 16,
                (4, 2) => *acc |= 1 << 24,
                (8, 10) => {
                    let ts = at(P + 2) << 24 | at(P + 3) << 16 | at(P + 4) << 8 | at(P + 5);
                    *acc = (*acc & 0xffff_ffff) | 1 << 25 | ts << 32;
                }
                _ => {}
            }
            P + size as usize
        }
    };
}
