//! Requests per peer: a token bucket for each [`Peer`], so that one
//! client asking as fast as it can (pipelined scrapes) is answered 429
//! cheaply instead of taking the daemon loop from everyone else. The table
//! is bounded: past [`MAX_PEERS`] peers, those whose bucket has refilled
//! are forgotten (they lose nothing), and if none has, the newcomer shares
//! one overflow bucket.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::Peer;

/// Peers remembered at once.
pub const MAX_PEERS: usize = 4096;

/// A rate and a burst per peer.
pub struct PerPeer {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<Option<Peer>, (f64, Instant)>>,
}

impl PerPeer {
    #[must_use]
    pub fn new(per_sec: u32, burst: u32) -> Self {
        Self { per_sec: f64::from(per_sec), burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Whether `peer` may make a request now; if not, how long until it may.
    pub fn take(&self, peer: Peer, now: Instant) -> Result<(), Duration> {
        let mut b = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if b.len() >= MAX_PEERS && !b.contains_key(&Some(peer)) {
            let (rate, burst) = (self.per_sec, self.burst);
            b.retain(|_, (tokens, at)| *tokens + now.saturating_duration_since(*at).as_secs_f64() * rate < burst);
        }
        let key = if b.len() >= MAX_PEERS && !b.contains_key(&Some(peer)) { None } else { Some(peer) };
        let (tokens, at) = b.entry(key).or_insert((self.burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * self.per_sec).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else if self.per_sec > 0.0 {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.per_sec))
        } else {
            Err(Duration::from_secs(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fast_peer_is_held_to_its_rate_and_others_are_not() {
        let r = PerPeer::new(5, 10);
        let t0 = Instant::now();
        let hog = Peer::Uid(65534);
        let ok = (0..1000).filter(|_| r.take(hog, t0).is_ok()).count();
        assert_eq!(ok, 10, "the burst, then nothing");
        let wait = r.take(hog, t0).unwrap_err();
        assert!(wait <= Duration::from_millis(200), "{wait:?}");
        assert!(r.take(Peer::Uid(0), t0).is_ok(), "another peer is untouched");
        // One second later: five more.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| r.take(hog, t1).is_ok()).count(), 5);
    }

    #[test]
    fn the_table_stays_bounded_and_full_buckets_are_forgotten() {
        let r = PerPeer::new(5, 10);
        let t0 = Instant::now();
        for i in 0..u32::try_from(MAX_PEERS + 100).unwrap() {
            let _ = r.take(Peer::Uid(i), t0);
        }
        assert!(r.buckets.lock().unwrap().len() <= MAX_PEERS + 1);
        // Later, every bucket has refilled: a newcomer makes room.
        let later = t0 + Duration::from_secs(5);
        assert!(r.take(Peer::Uid(u32::MAX - 1), later).is_ok());
        assert!(r.buckets.lock().unwrap().len() < 10);
    }
}
