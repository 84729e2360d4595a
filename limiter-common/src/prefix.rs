//! Masking a source address to its prefix, on raw network-order words so
//! the XDP program can use it on packet bytes directly.

/// Keep the top `len` bits of an IPv4 address held in network byte order
/// (`len` above 32 keeps all of it). Branch-free but for the clamp: the
/// XDP program computes it for every packet.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "a u32 shifted right stays a u32")]
pub const fn mask_v4(addr_be: u32, len: u32) -> u32 {
    let len = if len > 32 { 32 } else { len };
    addr_be & (!((u32::MAX as u64 >> len) as u32)).to_be()
}

/// Keep the top `len` bits of an IPv6 address held as four network-order words.
#[inline(always)]
#[must_use]
pub const fn mask_v6(addr: [u32; 4], len: u32) -> [u32; 4] {
    let mut out = [0u32; 4];
    let (mut i, mut start) = (0, 0u32);
    // Bounded loop of 4: unrolled by LLVM, trivially accepted by the verifier.
    while i < 4 {
        out[i] = mask_v4(addr[i], len.saturating_sub(start));
        i += 1;
        start += 32;
    }
    out
}

#[cfg(test)]
mod tests {
    use core::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn v4(a: &str, len: u32) -> Ipv4Addr {
        let be = u32::from_ne_bytes(a.parse::<Ipv4Addr>().unwrap().octets());
        Ipv4Addr::from(mask_v4(be, len).to_ne_bytes())
    }

    fn v6(text: &str, len: u32) -> Ipv6Addr {
        let octets = text.parse::<Ipv6Addr>().unwrap().octets();
        let words = core::array::from_fn(|i| u32::from_ne_bytes(octets[i * 4..i * 4 + 4].try_into().unwrap()));
        let mut out = [0u8; 16];
        for (chunk, word) in out.chunks_mut(4).zip(mask_v6(words, len)) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        Ipv6Addr::from(out)
    }

    #[test]
    fn v4_masks() {
        assert_eq!(v4("198.18.7.9", 24), Ipv4Addr::new(198, 18, 7, 0));
        assert_eq!(v4("198.18.7.9", 0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(v4("198.18.7.9", 32), Ipv4Addr::new(198, 18, 7, 9));
        assert_eq!(v4("198.19.255.255", 15), Ipv4Addr::new(198, 18, 0, 0));
    }

    proptest::proptest! {
        /// Against the arithmetic of a 128-bit address: the top `len`
        /// bits kept, the rest zero, every length 0..=128 (and beyond).
        #[test]
        fn masks_keep_exactly_the_top_bits(addr: u128, len in 0u32..=140) {
            let keep = |bits: u32, len: u32| if len == 0 { 0 } else { u128::MAX << (bits - len.min(bits)) };
            let words = core::array::from_fn(|i| u32::from_ne_bytes(addr.to_be_bytes()[i * 4..i * 4 + 4].try_into().unwrap()));
            let mut out = [0u8; 16];
            for (chunk, word) in out.chunks_mut(4).zip(mask_v6(words, len)) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            proptest::prop_assert_eq!(u128::from_be_bytes(out), addr & keep(128, len));
            let a = (addr >> 96) as u32;
            proptest::prop_assert_eq!(u128::from(u32::from_be(mask_v4(a.to_be(), len))), u128::from(a) & keep(32, len));
        }
    }

    #[test]
    fn v6_masks() {
        assert_eq!(v6("2001:2:0:1234:5678::1", 56), "2001:2:0:1200::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v6("2001:2:0:1234:5678::1", 64), "2001:2:0:1234::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v6("2001:2::1", 128), "2001:2::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v6("2001:2::1", 0), Ipv6Addr::UNSPECIFIED);
        assert_eq!(v6("2001:2:ffff::1", 33), "2001:2:8000::".parse::<Ipv6Addr>().unwrap());
    }
}
