//! The peers a node reads in the store and their clocks: who counts
//! (fresh heartbeats, at most [`store::MAX_PEERS`]) and how many slices
//! apart each one numbers its slices from this node.

use super::store;

/// A peer whose counts this node reads: its name and its clock's offset
/// from the store's, in ms (0 when its heartbeat does not say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub offset_ms: i64,
}

/// The peers to read from heartbeats read back at the store's `store_ms`:
/// every other node whose heartbeat is at most `fresh_ms` old on the
/// store's clock, freshest first, at most [`store::MAX_PEERS`].
#[must_use]
pub fn peers_of(beats: &[(String, u64, u64)], me: &str, store_ms: u64, fresh_ms: u64) -> Vec<Peer> {
    let mut v: Vec<(u64, Peer)> = beats
        .iter()
        .filter(|(n, _, _)| n != me)
        .filter_map(|(n, node_ms, store_at)| {
            // A heartbeat without the store's clock: judged by the node's.
            let stamped = *store_at != 0;
            let at = if stamped { *store_at } else { *node_ms };
            let age = store_ms.saturating_sub(at);
            let offset_ms = if stamped { offset(*node_ms, *store_at) } else { 0 };
            (age <= fresh_ms).then(|| (age, Peer { name: n.clone(), offset_ms }))
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    v.into_iter().take(store::MAX_PEERS).map(|(_, p)| p).collect()
}

/// `a - b` in ms, as a signed number.
#[must_use]
pub fn offset(a: u64, b: u64) -> i64 {
    i64::try_from(a).unwrap_or(i64::MAX).saturating_sub(i64::try_from(b).unwrap_or(i64::MAX))
}

/// How many slices of `slice_ms` a peer whose clock is `peer_ms` ahead of
/// the store's numbers its slices ahead of this node's (`own_ms` ahead):
/// 0 within a slice (sync latency, not skew).
#[must_use]
pub fn shift(peer_ms: i64, own_ms: i64, slice_ms: u64) -> i64 {
    let d = peer_ms.saturating_sub(own_ms);
    let slice = i64::try_from(slice_ms.max(1)).unwrap_or(i64::MAX);
    if d.abs() <= slice { 0 } else { (d + d.signum() * slice / 2) / slice }
}

/// What to read of `peers` for a window of `slices` ending with `cur` (on
/// this node's clock, `own_ms` off the store's): each peer's fields of the
/// window and the slice ahead, each named by the slice on the peer's own
/// clock, and (peer, slice on this node's clock) of each.
#[must_use]
pub fn reads(peers: &[Peer], own_ms: i64, slice_ms: u64, cur: u64, slices: u32) -> (Vec<(usize, u64)>, Vec<String>) {
    let mut at = Vec::new();
    let mut fields = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let k = shift(p.offset_ms, own_ms, slice_ms);
        // The window's slices, the one leaving it and one ahead.
        for s in cur.saturating_sub(u64::from(slices))..=cur + 1 {
            at.push((i, s));
            fields.push(store::field(&p.name, s.saturating_add_signed(k)));
        }
    }
    (at, fields)
}

/// The nodes (peers and `me`, whose clock is `own_ms` off the store's)
/// more than one slice of `slice_ms` off the store's clock, by name.
#[must_use]
pub fn skewed(peers: &[Peer], me: &str, own_ms: i64, slice_ms: u64) -> Vec<(String, i64)> {
    let limit = i64::try_from(slice_ms).unwrap_or(i64::MAX);
    let mut v: Vec<(String, i64)> = peers
        .iter()
        .map(|p| (p.name.clone(), p.offset_ms))
        .chain(std::iter::once((me.to_owned(), own_ms)))
        .filter(|(_, o)| o.abs() > limit)
        .collect();
    v.sort();
    v
}

/// Put the fresh `peers` first in `remembered`, keeping at most
/// `store::MAX_PEERS` names.
pub fn remember(remembered: &mut Vec<String>, peers: &[Peer]) {
    let fresh: Vec<String> = peers.iter().map(|p| p.name.clone()).collect();
    remembered.retain(|n| !fresh.contains(n));
    let mut all = fresh;
    all.append(remembered);
    all.truncate(store::MAX_PEERS);
    *remembered = all;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_the_fresh_others_and_their_clocks_are_read_against_the_store() {
        let store_ms = 1_000_000;
        let beats = [
            ("me".to_owned(), store_ms, store_ms),
            ("ahead".to_owned(), store_ms + 5_000, store_ms - 100),
            ("stale".to_owned(), store_ms - 60_000, store_ms - 60_000),
            ("old-build".to_owned(), store_ms - 200, 0),
        ];
        let peers = peers_of(&beats, "me", store_ms, 5_000);
        let names: Vec<&str> = peers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ahead", "old-build"], "freshest first, itself and the stale left out");
        assert_eq!((peers[0].offset_ms, peers[1].offset_ms), (5_100, 0));
        // Slices of 1 s: within a slice is latency, not skew.
        assert_eq!(shift(900, 0, 1_000), 0);
        assert_eq!(shift(5_100, 0, 1_000), 5);
        assert_eq!(shift(-5_100, 0, 1_000), -5);
        assert_eq!(shift(5_100, 5_000, 1_000), 0, "both ahead alike");
        assert_eq!(offset(3, 5), -2);
        let (at, fields) = reads(&peers, 0, 1_000, 100, 2);
        assert_eq!(
            at,
            [(0, 98), (0, 99), (0, 100), (0, 101), (1, 98), (1, 99), (1, 100), (1, 101)],
            "leaving, window, ahead"
        );
        assert_eq!(
            fields,
            [
                "ahead/103",
                "ahead/104",
                "ahead/105",
                "ahead/106",
                "old-build/98",
                "old-build/99",
                "old-build/100",
                "old-build/101"
            ]
        );
        assert_eq!(skewed(&peers, "me", -1_500, 1_000), [("ahead".to_owned(), 5_100), ("me".to_owned(), -1_500)]);
    }
}
