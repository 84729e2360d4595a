//! Upstreams of one forwarder: passive health (a failed connect takes an
//! upstream out, with a back-off doubling from 1 s to 30 s) and the choice
//! of the next one (round robin, or least connections).

use std::{
    net::SocketAddr,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::policy::forward::Balance;

const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// One upstream and what is known of it.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    /// Connections open to it now.
    pub active: AtomicUsize,
    /// `Some(until)` while taken out after a failure, and the back-off.
    down: Mutex<(Option<Instant>, Duration)>,
}

impl Upstream {
    fn new(addr: SocketAddr) -> Self {
        Self { addr, active: AtomicUsize::new(0), down: Mutex::new((None, BACKOFF.0)) }
    }

    /// Whether it is in service now.
    pub fn up(&self) -> bool {
        self.down.lock().expect("not poisoned").0.is_none_or(|until| Instant::now() >= until)
    }

    /// A connect failed: out for the back-off, which doubles.
    pub fn failed(&self) {
        let mut d = self.down.lock().expect("not poisoned");
        let backoff = d.1;
        *d = (Some(Instant::now() + backoff), (backoff * 2).min(BACKOFF.1));
    }

    /// A connect succeeded: in service, back-off reset.
    pub fn succeeded(&self) {
        *self.down.lock().expect("not poisoned") = (None, BACKOFF.0);
    }
}

/// The upstreams of one forwarder.
#[derive(Debug)]
pub struct Upstreams {
    pub list: Vec<Upstream>,
    balance: Balance,
    next: AtomicUsize,
}

impl Upstreams {
    #[must_use]
    pub fn new(addrs: &[SocketAddr], balance: Balance) -> Self {
        Self { list: addrs.iter().map(|a| Upstream::new(*a)).collect(), balance, next: AtomicUsize::new(0) }
    }

    #[must_use]
    /// The upstream to try next, skipping `tried` (indexes) and those out
    /// of service; `None` when none is left.
    pub fn pick(&self, tried: &[usize]) -> Option<usize> {
        let n = self.list.len();
        let usable = |i: &usize| !tried.contains(i) && self.list[*i].up();
        match self.balance {
            Balance::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|k| (start + k) % n).find(usable)
            }
            Balance::LeastConnections => {
                (0..n).filter(usable).min_by_key(|i| self.list[*i].active.load(Ordering::Relaxed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three(b: Balance) -> Upstreams {
        let a: Vec<SocketAddr> = (1..=3).map(|p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
        Upstreams::new(&a, b)
    }

    #[test]
    fn round_robin_skips_what_is_down_and_what_was_tried() {
        let u = three(Balance::RoundRobin);
        let picks: Vec<_> = (0..3).filter_map(|_| u.pick(&[])).collect();
        assert_eq!(picks, [0, 1, 2]);
        u.list[1].failed();
        let picks: Vec<_> = (0..4).filter_map(|_| u.pick(&[])).collect();
        assert!(!picks.contains(&1), "{picks:?}");
        assert_eq!(u.pick(&[0, 2]), None, "the only untried one is down");
        u.list[1].succeeded();
        assert_eq!(u.pick(&[0, 2]), Some(1));
    }

    #[test]
    fn least_connections_picks_the_idlest() {
        let u = three(Balance::LeastConnections);
        u.list[0].active.store(5, Ordering::Relaxed);
        u.list[1].active.store(2, Ordering::Relaxed);
        u.list[2].active.store(9, Ordering::Relaxed);
        assert_eq!(u.pick(&[]), Some(1));
        assert_eq!(u.pick(&[1]), Some(0));
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let u = Upstream::new(SocketAddr::from(([127, 0, 0, 1], 1)));
        for _ in 0..10 {
            u.failed();
        }
        assert!(!u.up());
        assert_eq!(u.down.lock().unwrap().1, BACKOFF.1);
    }
}
