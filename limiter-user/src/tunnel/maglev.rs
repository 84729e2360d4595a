//! Maglev's lookup table (Eisenbud et al., NSDI 2016): each backend walks
//! its own permutation of the table's slots (an offset and a skip from
//! two hashes of its address, so a backend's walk never depends on the
//! others), and the backends take turns claiming the next free slot of
//! their walk, a backend of weight w taking w turns a round, until every
//! slot is claimed. Adding or removing one of N backends moves about 1/N
//! of the slots; each backend holds about its weight's share.

use std::net::IpAddr;

use limiter_common::tunnel::{NO_BACKEND, TABLE_SIZE};

/// One backend as the table is built from it: its address (which fixes
/// its walk), its index in the program's backend map, its weight.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    pub addr: IpAddr,
    pub index: u32,
    pub weight: u32,
}

/// FNV-1a over the address's bytes, from `seed`.
fn hash(addr: IpAddr, seed: u64) -> u64 {
    let bytes: Vec<u8> = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    bytes.iter().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The table of [`TABLE_SIZE`] slots for `members` (each slot a member's
/// index; all [`NO_BACKEND`] if there are none).
#[must_use]
pub fn table(members: &[Member]) -> Vec<u32> {
    let m = u64::from(TABLE_SIZE);
    let mut out = vec![NO_BACKEND; TABLE_SIZE as usize];
    if members.is_empty() {
        return out;
    }
    let walks: Vec<(u64, u64)> =
        members.iter().map(|b| (hash(b.addr, 0x5eed) % m, hash(b.addr, 0x51c1) % (m - 1) + 1)).collect();
    let mut next = vec![0u64; members.len()];
    let mut filled = 0usize;
    loop {
        for (i, b) in members.iter().enumerate() {
            let (offset, skip) = walks[i];
            for _ in 0..b.weight {
                // Each walk visits every slot once (the size is prime), so
                // a free one is found while any is left.
                let slot = loop {
                    #[expect(clippy::cast_possible_truncation, reason = "below TABLE_SIZE")]
                    let c = ((offset + next[i] * skip) % m) as usize;
                    next[i] += 1;
                    if out[c] == NO_BACKEND {
                        break c;
                    }
                };
                out[slot] = b.index;
                filled += 1;
                if filled == out.len() {
                    return out;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, reason = "test shares of a 65,537-slot table")]
mod tests {
    use super::*;

    fn members(n: u32) -> Vec<Member> {
        (0..n).map(|i| Member { addr: IpAddr::from([198, 18, 2, 10 + i as u8]), index: i, weight: 1 }).collect()
    }

    fn share(t: &[u32], index: u32) -> f64 {
        t.iter().filter(|&&s| s == index).count() as f64 / t.len() as f64
    }

    #[test]
    fn each_backend_holds_its_weights_share() {
        let t = table(&members(5));
        for i in 0..5 {
            let s = share(&t, i);
            assert!((s - 0.2).abs() < 0.01, "backend {i} holds {s}");
        }
        let mut w = members(3);
        w[2].weight = 2;
        let t = table(&w);
        assert!((share(&t, 2) - 0.5).abs() < 0.01, "weight 2 of 4: {}", share(&t, 2));
        assert!(table(&[]).iter().all(|&s| s == NO_BACKEND));
    }

    #[test]
    fn adding_or_removing_one_of_n_moves_about_one_in_n() {
        for n in [2u32, 4, 10] {
            let before = table(&members(n));
            let after = table(&members(n + 1));
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as f64 / before.len() as f64;
            let ideal = 1.0 / f64::from(n + 1);
            assert!(moved < ideal * 1.35, "{n} -> {}: {moved:.3} of slots moved, ideal {ideal:.3}", n + 1);
            // Almost all of it to the new backend: Maglev shuffles a few
            // slots between the others too (its paper: a little more than
            // the minimum moves).
            let between = before.iter().zip(&after).filter(|(a, b)| a != b && **b != n).count() as f64;
            assert!(
                between / (before.len() as f64) < 0.02,
                "{n} -> {}: {between} slots moved between old backends",
                n + 1
            );
            let removed: Vec<Member> = members(n + 1).into_iter().filter(|m| m.index != 0).collect();
            let gone = table(&removed);
            let moved = after.iter().zip(&gone).filter(|(a, b)| a != b).count() as f64 / after.len() as f64;
            assert!(moved < ideal * 1.35, "removing one of {}: {moved:.3} moved", n + 1);
        }
    }
}
