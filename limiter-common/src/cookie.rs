//! SYN cookies in XDP (docs/design.md, "Spoofed SYN floods"): while a
//! class's cookies are engaged, a SYN from a prefix that holds no bucket is
//! answered from XDP with a SYN-ACK whose sequence number is a kernel SYN
//! cookie, and nothing is stored. Only a source that answers it (an ACK the
//! kernel's cookie helper accepts) has proven its address: its prefix gets
//! a bucket even while the new-source budget is spent, and the ACK goes on
//! to the kernel, which accepts the same cookie and completes the
//! connection (`net.ipv4.tcp_syncookies = 2`).

/// `syn_cookies` of a class, as stored in [`Cookies::mode`].
pub mod mode {
    /// Never: SYNs are charged as any packet.
    pub const OFF: u8 = 0;
    /// While the class is under a SYN flood (see [`super::SynGuard`]).
    pub const AUTO: u8 = 1;
    /// Every SYN from a prefix without a bucket.
    pub const ALWAYS: u8 = 2;
}

/// Length of an `auto` counting period, in 1/16 ns (250 ms).
pub const PERIOD: u64 = 250_000_000 << 4;
/// How long `auto` stays engaged after the last period that tripped it,
/// in 1/16 ns (5 s): the hysteresis that keeps it from flapping while a
/// flood goes on, and turns it off once the flood has ended.
pub const HOLD: u64 = 5_000_000_000 << 4;
/// How often one SYN per destination port and family is handed to the
/// kernel instead of being answered in XDP, in 1/16 ns (1 s). With
/// `tcp_syncookies = 2` the kernel answers it with its own cookie (storing
/// nothing) and so marks the listener as under a flood; a listener accepts
/// cookie ACKs only within two minutes of such a mark.
pub const REFRESH: u64 = 1_000_000_000 << 4;
/// Entries of the per-port refresh map: one per port for each family.
pub const REFRESH_SLOTS: u32 = 2 * 65_536;

/// The per-class SYN cookie settings in [`crate::Config`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cookies {
    /// [`mode`] of each class.
    pub mode: [u8; crate::MAX_CLASSES],
    /// `auto`: SYNs from prefixes without a bucket per [`PERIOD`] beyond
    /// which the class's cookies engage (from `syn_rate`, or the
    /// new-source budget's rate).
    pub per_period: [u32; crate::MAX_CLASSES],
    /// MSS the SYN-ACK advertises: the interface's MTU less the IPv4 and
    /// TCP headers, and less the IPv6 and TCP headers.
    pub mss4: u16,
    pub mss6: u16,
    /// [`opt`] bits: what the host's TCP takes back from a cookie's
    /// timestamp echo (set by the daemon from its sysctls; 0: MSS only).
    pub opts: u8,
    /// The window scale the SYN-ACK offers: the one the kernel will work
    /// out for the connection when it takes the cookie (from `tcp_rmem`
    /// and `rmem_max`, as `tcp_select_initial_window` does).
    pub wscale: u8,
    /// Always zero (explicit padding).
    pub pad: u16,
    /// The destination ports whose SYNs fall in a class with cookies on,
    /// as up to [`MAX_RANGES`] inclusive ranges `lo[i]..=hi[i]` of class
    /// `class[i]` (0 = unused), worked out by userspace from the matchers.
    /// An ACK is checked against the class its connection's SYN was in,
    /// found here without classifying the packet a second time.
    pub lo: [u16; MAX_RANGES],
    pub hi: [u16; MAX_RANGES],
    pub class: [u8; MAX_RANGES],
}

/// What a cookie's SYN-ACK may offer beside the MSS, in [`Cookies::opts`].
/// The kernel carries window scaling and SACK of a cookie connection in the
/// low bits of the timestamp it sent ([`timestamp`]); it subtracts a secret
/// per-connection offset from the echo first unless
/// `net.ipv4.tcp_timestamps = 2`, so only then can XDP offer them.
pub mod opt {
    /// Timestamps (`net.ipv4.tcp_timestamps = 2`): the carrier of the rest.
    pub const TIMESTAMPS: u8 = 1;
    /// SACK (`net.ipv4.tcp_sack = 1`).
    pub const SACK: u8 = 2;
    /// Window scaling (`net.ipv4.tcp_window_scaling = 1`).
    pub const WSCALE: u8 = 4;
}

/// The kernel's encoding in a cookie's timestamp: the client's window
/// scale (0xf: none), SACK, ECN (never offered here).
const TS_BITS: u32 = 6;
const TS_WSCALE_NONE: u32 = 0xf;
const TS_SACK: u32 = 1 << 4;
/// The largest window scale (RFC 7323).
pub const MAX_WSCALE: u8 = 14;

/// The timestamp value of a cookie's SYN-ACK at `now_ns` (the kernel's
/// TCP clock: `CLOCK_MONOTONIC` in ms), carrying the client's window scale
/// (`None`: not offered) and SACK, as `cookie_init_timestamp` makes it:
/// the clock with its low 6 bits replaced, never ahead of the clock.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "the TCP clock is 32 bits of ms")]
pub fn timestamp(now_ns: u64, client_wscale: Option<u8>, sack: bool) -> u32 {
    let now = (now_ns / 1_000_000) as u32;
    let ws = match client_wscale {
        Some(w) => u32::from(if w > MAX_WSCALE { MAX_WSCALE } else { w }),
        None => TS_WSCALE_NONE,
    };
    let options = ws | if sack { TS_SACK } else { 0 };
    let ts = ((now >> TS_BITS) << TS_BITS) | options;
    if ts > now { ts.wrapping_sub(1 << TS_BITS) } else { ts }
}

/// Port ranges of classes with SYN cookies, all classes together.
pub const MAX_RANGES: usize = 8;

impl Cookies {
    /// The class with cookies on that a SYN to `dport` is in, if any.
    #[inline(always)]
    #[must_use]
    pub fn class_of(&self, dport: u16) -> Option<usize> {
        for i in 0..MAX_RANGES {
            if self.class[i] != 0 && dport >= self.lo[i] && dport <= self.hi[i] {
                return Some(usize::from(self.class[i]) & (crate::MAX_CLASSES - 1));
            }
        }
        None
    }
}

/// Value of [`crate::maps::SYN_GUARD`], one per class: the `auto`
/// trigger. Written by XDP from any CPU without atomics: a lost increment
/// only delays a trigger by a packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynGuard {
    /// `now / PERIOD` of the period being counted.
    pub period: u64,
    /// SYNs from prefixes without a bucket in that period.
    pub count: u64,
    /// Engaged while `now < until` (1/16 ns on the program's clock).
    pub until: u64,
}

/// The SYN-ACK's receive window: ten segments of the MSS the cookie
/// encodes, which the kernel's own receive window for the connection is
/// never below, so the client cannot overrun it before the first window
/// update.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "capped to 16 bits first")]
pub const fn synack_window(cookie_mss: u16) -> u16 {
    let w = cookie_mss as u32 * 10;
    if w > 65_535 { 65_535 } else { w as u16 }
}

/// One's-complement sum of big-endian 16-bit words, for the Internet
/// checksum; `bytes` has an even length.
#[inline(always)]
#[must_use]
pub fn sum16(bytes: &[u8], mut acc: u32) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        acc += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    acc
}

/// Fold a [`sum16`] into the 16-bit checksum field's value.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits first")]
pub const fn fold(mut acc: u32) -> u16 {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    !(acc as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_ipv4_header() {
        // RFC 1071 style example: a header whose checksum field is 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(fold(sum16(&h, 0)), 0xb861);
        let mut with = h;
        with[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(fold(sum16(&with, 0)), 0);
    }

    /// What the kernel's `cookie_timestamp_decode` reads back from the
    /// echo: (window scale if any, SACK).
    fn decode(echo: u32) -> (Option<u8>, bool) {
        let ws = u8::try_from(echo & 0xf).unwrap();
        ((ws != 0xf).then_some(ws), echo & (1 << 4) != 0)
    }

    #[test]
    fn the_timestamp_carries_window_scale_and_sack_and_trails_the_clock() {
        for now_ns in [0u64, 64_000_000, 1_234_567_890_123, u64::from(u32::MAX) * 1_000_000 + 999_999] {
            for ws in [None, Some(0), Some(7), Some(14), Some(15)] {
                for sack in [false, true] {
                    let ts = timestamp(now_ns, ws, sack);
                    assert_eq!(decode(ts), (ws.map(|w| w.min(14)), sack), "{now_ns} {ws:?} {sack}");
                    let clock = u32::try_from(now_ns / 1_000_000 % (1 << 32)).unwrap();
                    // Within 64 ms behind the clock (never ahead).
                    assert!(clock.wrapping_sub(ts) < 64, "{now_ns}: {ts} vs {clock}");
                }
            }
        }
    }

    #[test]
    fn the_window_is_ten_segments_and_fits_16_bits() {
        assert_eq!(synack_window(1460), 14_600);
        assert_eq!(synack_window(8960), 65_535);
    }
}
