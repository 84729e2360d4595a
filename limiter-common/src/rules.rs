//! Which bucket a parsed packet is charged to: its rule class (the first
//! matcher of the policy that fits) and its source masked to the policy's
//! prefix length. Pure code, shared by the XDP program and userspace.

use crate::{
    BucketKey, Config, MAX_CLASSES, MAX_MATCHERS, family,
    packet::Source,
    port_side,
    prefix::{mask_v4, mask_v6},
};

/// The first matcher that fits the packet names its class; else class 0.
#[inline(always)]
#[must_use]
pub fn classify(cfg: &Config, src: &Source) -> usize {
    for i in 0..MAX_MATCHERS {
        if i >= cfg.n_matchers as usize {
            break;
        }
        let m = &cfg.matchers[i];
        if m.proto != 0 && m.proto != src.proto {
            continue;
        }
        let any_port = m.port_lo == 0 && m.port_hi == u16::MAX;
        let port = if m.side == port_side::SOURCE { src.sport } else { src.dport };
        if !any_port && (src.port_known == 0 || port < m.port_lo || port > m.port_hi) {
            continue;
        }
        if m.syn != 0 && src.syn == 0 {
            continue;
        }
        return usize::from(m.class) & (MAX_CLASSES - 1);
    }
    0
}

/// The bucket key of `src` masked to its family's prefix length.
#[inline(always)]
#[must_use]
pub fn bucket_key(src: &Source, v4_len: u32, v6_len: u32, class: u8) -> BucketKey {
    key_of(src.family, src.addr, v4_len, v6_len, class)
}

/// The bucket key of a source address (`addr` as [`Source::addr`]) of
/// `fam`, masked to its family's prefix length.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "prefix lengths are at most 64 (checked by the policy)")]
pub fn key_of(fam: crate::Family, addr: [u32; 4], v4_len: u32, v6_len: u32, class: u8) -> BucketKey {
    if fam == family::IPV4 {
        BucketKey { family: family::IPV4, prefix_len: v4_len as u8, class, pad: 0, addr: [mask_v4(addr[0], v4_len), 0] }
    } else {
        // v6_len <= MAX_V6_BUCKET_PREFIX (policy-checked): the first 64
        // bits hold the whole prefix.
        let [a, b, _, _] = mask_v6(addr, v6_len);
        BucketKey { family: family::IPV6, prefix_len: v6_len as u8, class, pad: 0, addr: [a, b] }
    }
}

/// `key` masked to a coarser prefix (`v4_len`, `v6_len`, no longer than
/// its own) in class 0: the aggregate tier's key of the same source.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "prefix lengths are at most 128")]
pub fn coarser(key: &BucketKey, v4_len: u32, v6_len: u32) -> BucketKey {
    if key.family == family::IPV4 {
        BucketKey {
            family: key.family,
            prefix_len: v4_len as u8,
            class: 0,
            pad: 0,
            addr: [mask_v4(key.addr[0], v4_len), 0],
        }
    } else {
        let [a, b, _, _] = mask_v6([key.addr[0], key.addr[1], 0, 0], v6_len);
        BucketKey { family: key.family, prefix_len: v6_len as u8, class: 0, pad: 0, addr: [a, b] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Matcher, packet::IPPROTO_TCP};

    fn syn_to(dport: u16) -> Source {
        Source {
            family: family::IPV4,
            addr: [u32::from_ne_bytes([198, 18, 7, 9]), 0, 0, 0],
            proto: IPPROTO_TCP,
            port_known: 1,
            syn: 1,
            dport,
            ..Source::default()
        }
    }

    #[test]
    fn the_first_matching_class_wins_and_the_rest_is_class_zero() {
        let mut cfg = Config { n_matchers: 2, ..Config::default() };
        cfg.matchers[0] = Matcher { proto: IPPROTO_TCP, syn: 1, class: 3, side: 0, port_lo: 443, port_hi: 443 };
        cfg.matchers[1] = Matcher { proto: 0, syn: 0, class: 5, side: 0, port_lo: 400, port_hi: 500 };
        assert_eq!(classify(&cfg, &syn_to(443)), 3);
        assert_eq!(classify(&cfg, &Source { syn: 0, ..syn_to(443) }), 5);
        assert_eq!(classify(&cfg, &syn_to(80)), 0);
        // A matcher beyond n_matchers is ignored.
        cfg.n_matchers = 1;
        assert_eq!(classify(&cfg, &Source { syn: 0, ..syn_to(443) }), 0);
    }

    #[test]
    fn a_source_port_matcher_takes_the_answers_of_its_service_only() {
        use crate::packet::IPPROTO_UDP;
        let mut cfg = Config { n_matchers: 2, ..Config::default() };
        let reflection =
            Matcher { proto: IPPROTO_UDP, syn: 0, class: 2, side: port_side::SOURCE, port_lo: 123, port_hi: 123 };
        cfg.matchers[0] = reflection;
        cfg.matchers[1] = Matcher { proto: IPPROTO_UDP, class: 4, port_lo: 123, port_hi: 123, ..Matcher::default() };
        let udp = |sport, dport| Source { proto: IPPROTO_UDP, syn: 0, sport, dport, ..syn_to(0) };
        // An NTP answer (from 123) is the reflection class's, whatever
        // port it is sent to; a query to this host's NTP server (to 123)
        // is the other class's.
        assert_eq!(classify(&cfg, &udp(123, 40_000)), 2);
        assert_eq!(classify(&cfg, &udp(40_000, 123)), 4);
        assert_eq!(classify(&cfg, &udp(53, 40_000)), 0);
        // A packet without ports (a later fragment) is in neither.
        assert_eq!(classify(&cfg, &Source { port_known: 0, ..udp(123, 123) }), 0);
    }

    #[test]
    fn keys_are_masked_to_the_prefix() {
        let k = bucket_key(&syn_to(443), 24, 56, 2);
        assert_eq!((k.family, k.prefix_len, k.class), (family::IPV4, 24, 2));
        assert_eq!(k.addr, [u32::from_ne_bytes([198, 18, 7, 0]), 0]);
    }
}
