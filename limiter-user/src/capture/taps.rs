//! `limiter capture`'s taps: each a filter and a bounded queue of the
//! frames it took, read by its client a batch at a time. Bounded in
//! number, in frames queued (the oldest are lost and counted when a
//! client reads slower than frames come), and in time: a tap its client
//! has not read for [`IDLE`] is closed (a client that died never holds
//! the data plane in capture).

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use super::{Filter, Frame, Want};

/// Taps open at once.
pub const MAX_TAPS: usize = 4;
/// Frames a tap queues for its client.
pub const QUEUE: usize = 8_192;
/// Frames one read returns at most.
pub const BATCH: usize = 1_024;
/// A tap not read for this long is closed.
pub const IDLE: Duration = Duration::from_secs(10);
/// Passed frames a second copied at most for the taps that ask for them
/// (a random sample once more pass; the ring holds about 14,000 and is
/// drained five times a second).
pub const PASSES_PER_SECOND: u64 = 10_000;

#[derive(Debug)]
struct Tap {
    filter: Filter,
    queue: VecDeque<Frame>,
    /// Frames lost to a full queue, not yet told.
    lost: u64,
    read_at: Instant,
}

/// The open taps.
#[derive(Debug, Default)]
pub struct Taps {
    taps: BTreeMap<u64, Tap>,
    next: u64,
}

/// Why a tap was not opened or read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TapError {
    #[error("{MAX_TAPS} captures are open already; retry when one ends")]
    Full,
    #[error("no capture {0} is open (it ended, or was not read for {idle} s)", idle = IDLE.as_secs())]
    Unknown(u64),
    #[error("{0}")]
    Filter(String),
}

impl Taps {
    /// Open a tap taking what `filter` takes; its id.
    pub fn open(&mut self, filter: Filter, class_names: &[String], now: Instant) -> Result<u64, TapError> {
        filter.check(class_names).map_err(TapError::Filter)?;
        self.expire(now);
        if self.taps.len() >= MAX_TAPS {
            return Err(TapError::Full);
        }
        self.next += 1;
        self.taps.insert(self.next, Tap { filter, queue: VecDeque::new(), lost: 0, read_at: now });
        Ok(self.next)
    }

    /// The frames tap `id` queued (at most [`BATCH`]) and how many it lost
    /// since the last read.
    pub fn read(&mut self, id: u64, now: Instant) -> Result<(Vec<Frame>, u64), TapError> {
        let tap = self.taps.get_mut(&id).ok_or(TapError::Unknown(id))?;
        tap.read_at = now;
        let n = tap.queue.len().min(BATCH);
        Ok((tap.queue.drain(..n).collect(), std::mem::take(&mut tap.lost)))
    }

    /// Close tap `id`; whether it was open.
    pub fn close(&mut self, id: u64) -> bool {
        self.taps.remove(&id).is_some()
    }

    /// Hand `frames` to every tap whose filter takes them.
    pub fn offer(&mut self, frames: &[Frame], class_names: &[String]) {
        for tap in self.taps.values_mut() {
            for f in frames.iter().filter(|f| tap.filter.takes(f, class_names)) {
                if tap.queue.len() == QUEUE {
                    tap.queue.pop_front();
                    tap.lost += 1;
                }
                tap.queue.push_back(f.clone());
            }
        }
    }

    /// Close the taps not read for [`IDLE`].
    pub fn expire(&mut self, now: Instant) {
        self.taps.retain(|_, t| now.duration_since(t.read_at) < IDLE);
    }

    /// What the open taps ask of the data plane: every drop, while any
    /// tap of drops is open.
    #[must_use]
    pub fn want(&self) -> Option<Want> {
        self.taps.values().any(|t| !t.filter.passed).then_some(Want::Every)
    }

    /// Passed frames a second they ask for: [`PASSES_PER_SECOND`] while
    /// any tap of passes is open.
    #[must_use]
    pub fn want_passes(&self) -> Option<u64> {
        self.taps.values().any(|t| t.filter.passed).then_some(PASSES_PER_SECOND)
    }

    /// Taps open.
    #[must_use]
    pub fn len(&self) -> usize {
        self.taps.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.taps.is_empty()
    }
}
