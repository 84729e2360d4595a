//! What one sync sends: for each prefix touched (or near its limit) of a
//! fleet class still in the map, its local counts, the deltas to add to
//! the store, its own fields that left the window, and the peers' fields
//! to read back.

use std::time::Duration;

use limiter_common::BucketKey;

use super::{MAX_PUSH, Sync, peers, share, store};
use crate::dataplane::cidr;

/// One prefix's push, and how to read what comes back.
pub(super) struct Planned {
    pub key: BucketKey,
    /// The local counts pushed.
    pub local: limiter_common::window::WindowState,
    /// When on this node's clock, in the prefix's class.
    pub at: share::Moment,
    pub limit: u64,
    pub push: store::Push,
    /// (peer, slice on this node's clock) of each field `push` reads.
    pub reads: Vec<(usize, u64)>,
}

impl Sync {
    /// The pushes of this sync: each pending prefix of a fleet class
    /// still in the map, with its local counts and the deltas to send.
    pub(super) fn plan(&mut self, wall_ns: u64) -> Vec<Planned> {
        let classes = self.classes.borrow().clone();
        let me = self.cfg.node.clone();
        let interval_ns = u64::try_from(self.cfg.sync_interval.as_nanos()).unwrap_or(u64::MAX);
        let mut batch: Vec<Planned> = Vec::new();
        for key in self.ledger.pending().into_iter().take(MAX_PUSH) {
            let Some(c) = classes.of(&key).filter(|c| c.fleet) else {
                self.ledger.forget(&key);
                continue;
            };
            let Ok(local) = self.maps.windows.get(&key, 0) else {
                self.ledger.forget(&key);
                continue;
            };
            let at = share::Moment::at(wall_ns, c.slice_ns, interval_ns, c.slices);
            let cur = at.cur;
            let deltas = self.ledger.deltas(&key, &local, cur, c.slices);
            let n = u64::from(c.slices);
            let (reads, fields) = peers::reads(&self.peers, self.offset_ms, c.slice_ns / 1_000_000, cur, c.slices);
            let push = store::Push {
                key: store::key(&c.name, &cidr(&BucketKey { class: 0, ..key })),
                deltas: deltas.into_iter().map(|(s, d)| (store::field(&me, s), d)).collect(),
                read: fields,
                expired: self.ledger.expired(&key, cur, c.slices).into_iter().map(|s| store::field(&me, s)).collect(),
                ttl: Duration::from_nanos(c.slice_ns.saturating_mul(n + 1)),
            };
            batch.push(Planned { key, local, at, limit: c.limit, push, reads });
        }
        batch
    }
}
