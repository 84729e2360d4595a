//! What the daemon observes while it runs: tracked prefixes (counted on a
//! thread of its own), sampled drops and per-second totals for `limiter
//! top`, the program's own log lines, and the periodic status line.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use limiter_common::{Action, DropEvent, Reason};

use crate::engine::feature::Sample;
use crate::{dataplane::Totals, top::Tracker};

/// The observing side of the daemon.
pub(super) struct Observer {
    /// Tracked prefixes, counted in the background by [`spawn_counter`],
    /// and when that count began (Unix ms; 0 before the first).
    tracked: Arc<(AtomicUsize, AtomicU64)>,
    /// Sampled drops and per-second totals for `limiter top`.
    pub top: Tracker,
    /// Shadow mode's would-be drops, apart: nothing acts on them (link
    /// pressure reads `top`), `limiter top` shows them.
    pub shadow: Tracker,
    drop_events: Option<RingBuf<MapData>>,
    /// Forwards the program's aya-log lines (debug level only).
    ebpf_log: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// Totals at the last per-second tick.
    last_tick: Option<Totals>,
    /// Each group's counts at the last tick, and what the second before
    /// it passed and dropped (for `limiter top`).
    groups: (Vec<limiter_common::groups::GroupHits>, Vec<(u64, u64)>),
}

impl Observer {
    pub fn new(
        buckets_map_id: u32,
        drop_events: Option<RingBuf<MapData>>,
        ebpf_log: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    ) -> Self {
        Self {
            tracked: spawn_counter(buckets_map_id, Duration::from_secs(2)),
            top: Tracker::default(),
            shadow: Tracker::default(),
            drop_events,
            ebpf_log,
            last_tick: None,
            groups: (Vec::new(), Vec::new()),
        }
    }

    /// Once a second: each group's counts (by index), for its rates.
    pub fn tick_groups(&mut self, hits: Vec<limiter_common::groups::GroupHits>) {
        let (last, rates) = &mut self.groups;
        *rates = hits
            .iter()
            .zip(last.iter().chain(std::iter::repeat(&limiter_common::groups::GroupHits::default())))
            .map(|(h, l)| (h.passed.saturating_sub(l.passed), h.dropped.saturating_sub(l.dropped)))
            .collect();
        *last = hits;
    }

    /// What each group (by index) passed and dropped in the last second.
    pub fn group_rates(&self) -> &[(u64, u64)] {
        &self.groups.1
    }

    /// Tracked prefixes as last counted in the background.
    pub fn tracked(&self) -> usize {
        self.tracked.0.load(Ordering::Relaxed)
    }

    /// When the last count of tracked prefixes began (Unix ms).
    pub fn tracked_at_ms(&self) -> u64 {
        self.tracked.1.load(Ordering::Relaxed)
    }

    /// Move sampled drop events from the ring buffer into the tracker,
    /// handing each to `each` (the features: escalation's evidence).
    pub fn drain_drop_events(&mut self, mut each: impl FnMut(&Sample)) {
        if let Some(l) = self.ebpf_log.as_mut() {
            l.flush();
        }
        let now = crate::clock::unix_now();
        let Some(rb) = self.drop_events.as_mut() else { return };
        while let Some(item) = rb.next() {
            // A program of a build before addresses were sent writes 16
            // bytes: no address, so nothing of it is proven.
            let mut ev = DropEvent::default();
            let n = item.len().min(std::mem::size_of::<DropEvent>());
            if n < std::mem::offset_of!(DropEvent, src) {
                continue;
            }
            // SAFETY: `n` bytes of a DropEvent written by the program,
            // copied into a zeroed one.
            unsafe { std::ptr::copy_nonoverlapping(item.as_ptr(), (&raw mut ev).cast::<u8>(), n) };
            let src = (n >= std::mem::offset_of!(DropEvent, held)).then(|| source(&ev)).flatten();
            if ev.reason == Reason::ShadowDropped as u32 {
                self.shadow.record(now, ev.key);
            } else if ev.reason != Reason::SynCookieVerified as u32 {
                self.top.record(now, ev.key);
            }
            each(&Sample { key: ev.key, src, held: ev.held == 1, reason: ev.reason, at: now, port: ev.port() });
        }
    }

    /// Once a second: note packets passed and dropped for the sparkline;
    /// what the program counted in that second (none at the first).
    pub fn tick_second(&mut self, t: &Totals) -> Option<Totals> {
        let d = self.last_tick.replace(*t).map(|last| t.since(&last))?;
        self.top.tick(crate::clock::unix_now(), d.passed().packets, d.dropped().packets);
        Some(d)
    }
}

/// The source address of an event.
pub(super) fn source(ev: &DropEvent) -> Option<std::net::IpAddr> {
    // Each word holds its 4 bytes in network order: no allocation per event.
    let mut bytes = [0u8; 16];
    for (chunk, w) in bytes.chunks_exact_mut(4).zip(ev.src) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    match ev.key.family {
        limiter_common::family::IPV4 => Some(std::net::IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])),
        limiter_common::family::IPV6 => Some(std::net::IpAddr::from(bytes)),
        _ => None,
    }
}

/// Count the bucket map's entries on a thread of its own, with its own
/// map handle, so a count of a million prefixes never blocks the daemon
/// loop, a scrape or a status line. It counts every `every`, or every 50
/// count durations when counts get long, so counting stays under 2% of a
/// core; the count is that old at most. (Each entry costs a cache miss or
/// two however it is read: batches made a count of a million 2.3x
/// cheaper than walking the keys, not free.)
fn spawn_counter(map_id: u32, every: Duration) -> Arc<(AtomicUsize, AtomicU64)> {
    let count = Arc::new((AtomicUsize::new(0), AtomicU64::new(0)));
    let out = Arc::clone(&count);
    std::thread::spawn(move || {
        let Ok(md) = MapData::from_id(map_id) else { return };
        loop {
            let start = std::time::Instant::now();
            let at = crate::clock::unix_millis();
            let n = crate::dataplane::tracked_prefixes(&md);
            count.0.store(n, Ordering::Relaxed);
            count.1.store(at, Ordering::Relaxed);
            std::thread::sleep(every.max(start.elapsed() * 50));
        }
    });
    out
}

/// `passed P (r/s) dropped D (r/s) tracked N/CAP`, plus each reason seen
/// that did not pass (drops and shadow drops).
#[must_use]
pub fn status_line(now: &Totals, last: &Totals, dt: Duration, tracked: usize, capacity: u32) -> String {
    let d = now.since(last);
    let secs = dt.as_secs_f64().max(1e-9);
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let rate = |n: u64| n as f64 / secs;
    let mut line = format!(
        "passed {} ({:.0}/s) dropped {} ({:.0}/s) tracked {tracked}/{capacity}",
        now.passed().packets,
        rate(d.passed().packets),
        now.dropped().packets,
        rate(d.dropped().packets),
    );
    for r in Reason::ALL {
        let c = now.get(r);
        if r.action() != Action::Pass && c.packets > 0 {
            let _ = write!(line, " {}={}", r.label(), c.packets);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use limiter_common::Counter;

    use super::*;

    #[test]
    fn the_status_line_lists_what_did_not_pass() {
        let mut now = Totals::default();
        now.add(Reason::Admitted, limiter_common::family::IPV4, Counter { packets: 10, bytes: 0 });
        now.add(Reason::RateLimited, limiter_common::family::IPV4, Counter { packets: 4, bytes: 0 });
        now.add(Reason::ShadowDropped, limiter_common::family::IPV6, Counter { packets: 3, bytes: 0 });
        let line = status_line(&now, &Totals::default(), Duration::from_secs(1), 5, 9);
        assert_eq!(line, "passed 13 (13/s) dropped 4 (4/s) tracked 5/9 rate_limited=4 shadow_dropped=3");
    }
}
