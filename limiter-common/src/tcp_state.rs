//! Out-of-state TCP (docs/tcp-state.md): a class with `tcp_state` on
//! passes a TCP segment other than a plain SYN, to a port this host
//! listens on, only if a socket of the host holds its 4-tuple (one
//! established, a request in SYN-RECV, one in TIME_WAIT) or it carries a
//! SYN cookie the kernel's helper accepts. Anything else (the bare ACKs,
//! RSTs, FINs and data of a flood) is dropped at the driver as
//! `tcp_out_of_state`. A segment no listener would take (traffic the host
//! routes, ports nobody listens on) is never judged.

/// `tcp_state` of a class, as its two bits in [`crate::Config::flags`]
/// (see [`crate::flags::TCP_STATE_SHIFT`]).
pub mod mode {
    /// Never judged.
    pub const OFF: u8 = 0;
    /// Judged while out-of-state segments are seen (see [`super::PROBE_ONE_IN`]).
    pub const AUTO: u8 = 1;
    /// Every segment judged.
    pub const ALWAYS: u8 = 2;
}

/// While `auto` is not engaged, one admitted segment of the class in
/// this many (drawn at random) is asked of the socket tables: the
/// detector, which costs the admit path a draw and a test.
pub const PROBE_ONE_IN: u64 = 64;
/// A counting period is 2^PERIOD_SHIFT units of 1/16 ns: 2^28 ns, about
/// 268 ms. A power of two, so a time's period is a shift: BPF has only a
/// 64-bit divide, which the x86 JIT makes a `div` costing tens of ns on
/// every segment the check drops.
pub const PERIOD_SHIFT: u32 = 32;
/// `auto` engages when a period's out-of-state segments, estimated from
/// the probes (each found counts [`PROBE_ONE_IN`]), pass this: 1,000 a
/// second. A closed connection's late segments and a port scan stay far
/// below it; a flood passes it within a period.
pub const PER_PERIOD: u64 = (1_000 << PERIOD_SHIFT) / (1_000_000_000 << 4);
/// How long `auto` stays engaged after the last period that passed the
/// threshold, in 1/16 ns (10 s).
pub const HOLD: u64 = 10_000_000_000 << 4;
/// How long a connection found held is remembered, in 1/16 ns (5 s): its
/// segments in that time are passed without asking the kernel.
pub const REMEMBER: u64 = 5_000_000_000 << 4;
/// Entries of the per-CPU cache of held connections ([`crate::maps::TCP_HELD`]),
/// direct-mapped by a hash of the 4-tuple: a collision only costs the
/// evicted connection one more lookup.
pub const HELD_ENTRIES: u32 = 8_192;

/// Words of a 4-tuple as `bpf_sock_tuple` lays it out (IPv4: source,
/// destination, ports, then zeros; IPv6: the same in 36 bytes).
pub const TUPLE_WORDS: usize = 9;

/// Value of [`crate::maps::TCP_HELD`]: a connection this host holds, as
/// its segments carry it (source = the peer, network order), and until
/// when it is remembered.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub tuple: [u32; TUPLE_WORDS],
    /// [`crate::family`] of the tuple.
    pub family: u32,
    /// 1/16 ns on the program's clock; 0: empty.
    pub until: u64,
}

/// The slot of [`crate::maps::TCP_HELD`] for a 4-tuple.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "masked to the table")]
pub fn slot(tuple: &[u32; TUPLE_WORDS]) -> u32 {
    // Two words a multiply: five for the nine.
    let mut h: u64 = 0;
    let mut i = 0;
    while i < TUPLE_WORDS {
        let high = if i + 1 < TUPLE_WORDS { u64::from(tuple[i + 1]) << 32 } else { 0 };
        h = (h ^ u64::from(tuple[i]) ^ high).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        i += 2;
    }
    ((h ^ (h >> 29)) as u32) & (HELD_ENTRIES - 1)
}

/// The class's [`mode`] in `flags`.
#[inline(always)]
#[must_use]
pub const fn of(flags: u32, class: usize) -> u8 {
    let on = flags >> (crate::flags::TCP_STATE_SHIFT as usize + class) & 1 != 0;
    let auto = flags >> (crate::flags::TCP_STATE_AUTO_SHIFT as usize + class) & 1 != 0;
    match (on, auto) {
        (false, _) => mode::OFF,
        (true, true) => mode::AUTO,
        (true, false) => mode::ALWAYS,
    }
}

/// The bits of `flags` that give `class` the mode `m`.
#[must_use]
pub const fn bits(class: usize, m: u8) -> u32 {
    match m {
        mode::AUTO => {
            (1 << (crate::flags::TCP_STATE_SHIFT as usize + class))
                | (1 << (crate::flags::TCP_STATE_AUTO_SHIFT as usize + class))
        }
        mode::ALWAYS => 1 << (crate::flags::TCP_STATE_SHIFT as usize + class),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_the_flags_of_every_class() {
        for class in 0..crate::MAX_CLASSES {
            for m in [mode::OFF, mode::AUTO, mode::ALWAYS] {
                let flags = bits(class, m) | crate::flags::CONFIGURED;
                assert_eq!(of(flags, class), m);
                for other in (0..crate::MAX_CLASSES).filter(|c| *c != class) {
                    assert_eq!(of(flags, other), mode::OFF);
                }
            }
        }
    }

    #[test]
    #[expect(clippy::cast_precision_loss, reason = "both far inside f64's exact range")]
    fn the_period_is_about_a_quarter_second_and_the_threshold_a_thousand_a_second() {
        let period_s = (1u64 << PERIOD_SHIFT) as f64 / 16e9;
        assert!((0.2..0.3).contains(&period_s), "{period_s} s");
        let per_s = PER_PERIOD as f64 / period_s;
        assert!((995.0..=1_000.0).contains(&per_s), "{per_s} a second");
    }

    #[test]
    fn slots_spread_and_stay_in_the_table() {
        let mut seen = [false; HELD_ENTRIES as usize];
        for port in 0..4_096u32 {
            let s = slot(&[0x0a00_0001, 0xc612_0002, port << 16 | 0x01bb, 0, 0, 0, 0, 0, 0]);
            seen[s as usize] = true;
        }
        // 4,096 ports of one client over 8,192 slots: about 3,220 distinct
        // if the hash is uniform; a weak one collides far more.
        assert!(seen.iter().filter(|s| **s).count() > 3_000);
    }
}
