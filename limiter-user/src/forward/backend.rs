//! Backends of one forwarder: passive health (a failed connect takes an
//! backend out, with a back-off doubling from 1 s to 30 s once per
//! failure episode, not once per connection that failed at the same
//! time; when the back-off runs out, one probe connection at a time goes
//! through until one succeeds) and the choice of the next one (round
//! robin, or least connections).

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

/// One backend and what is known of it.
#[derive(Debug)]
pub struct Backend {
    pub addr: SocketAddr,
    /// Connections open to it now.
    pub active: AtomicUsize,
    /// Its health (see [`Health`]).
    down: Mutex<Health>,
}

/// What is known of a backend's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Health {
    /// Out of service until then, after a failure.
    until: Option<Instant>,
    /// The next back-off.
    backoff: Duration,
    /// A probe connection is out (the back-off ran out; only it may try).
    probing: bool,
}

impl Backend {
    fn new(addr: SocketAddr) -> Self {
        let h = Health { until: None, backoff: BACKOFF.0, probing: false };
        Self { addr, active: AtomicUsize::new(0), down: Mutex::new(h) }
    }

    /// Whether a connection may be sent to it now: in service, or out but
    /// due for a probe that nobody is making.
    pub fn up(&self) -> bool {
        let h = self.down.lock().expect("not poisoned");
        h.until.is_none_or(|until| Instant::now() >= until && !h.probing)
    }

    /// Take it for one connection: `true` when in service, or when this
    /// connection becomes the one probe of a backend whose back-off ran
    /// out.
    fn take(&self) -> bool {
        let mut h = self.down.lock().expect("not poisoned");
        match h.until {
            None => true,
            Some(until) if Instant::now() >= until && !h.probing => {
                h.probing = true;
                true
            }
            Some(_) => false,
        }
    }

    /// A connect failed: out for the back-off. It doubles once per failure
    /// episode: the failure of a probe, or the first after being in
    /// service; connections that failed at the same time as others do not
    /// double it again.
    pub fn failed(&self) {
        let mut h = self.down.lock().expect("not poisoned");
        let now = Instant::now();
        let new_episode = h.probing || h.until.is_none();
        if !new_episode && h.until.is_some_and(|u| u > now) {
            return;
        }
        let backoff = h.backoff;
        *h = Health { until: Some(now + backoff), backoff: (backoff * 2).min(BACKOFF.1), probing: false };
    }

    /// A connect succeeded: in service, back-off reset.
    pub fn succeeded(&self) {
        *self.down.lock().expect("not poisoned") = Health { until: None, backoff: BACKOFF.0, probing: false };
    }

    /// A connection taken for it never reached it (a local failure, such
    /// as no descriptor left): says nothing of its health; a probe is
    /// given back.
    pub fn untried(&self) {
        self.down.lock().expect("not poisoned").probing = false;
    }
}

/// The backends of one forwarder.
#[derive(Debug)]
pub struct Backends {
    pub list: Vec<Backend>,
    balance: Balance,
    next: AtomicUsize,
}

impl Backends {
    #[must_use]
    pub fn new(addrs: &[SocketAddr], balance: Balance) -> Self {
        Self { list: addrs.iter().map(|a| Backend::new(*a)).collect(), balance, next: AtomicUsize::new(0) }
    }

    #[must_use]
    /// The backend to try next, skipping `tried` (indexes) and those out
    /// of service; `None` when none is left.
    pub fn pick(&self, tried: &[usize]) -> Option<usize> {
        let n = self.list.len();
        let usable = |i: &usize| !tried.contains(i) && self.list[*i].up();
        let pick = match self.balance {
            Balance::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|k| (start + k) % n).find(usable)
            }
            Balance::LeastConnections => {
                (0..n).filter(usable).min_by_key(|i| self.list[*i].active.load(Ordering::Relaxed))
            }
        }?;
        // Another connection may have taken the probe meanwhile.
        if self.list[pick].take() {
            return Some(pick);
        }
        let mut tried = tried.to_vec();
        tried.push(pick);
        self.pick(&tried)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three(b: Balance) -> Backends {
        let a: Vec<SocketAddr> = (1..=3).map(|p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
        Backends::new(&a, b)
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
    fn the_backoff_doubles_once_per_episode_up_to_its_cap() {
        let u = Backend::new(SocketAddr::from(([127, 0, 0, 1], 1)));
        // Forty connections failing at once: one episode, 1 s.
        for _ in 0..40 {
            u.failed();
        }
        assert!(!u.up());
        assert_eq!(u.down.lock().unwrap().backoff, BACKOFF.0 * 2, "doubled once");
        // Probes that fail, one after another: each doubles it, to the cap.
        for _ in 0..10 {
            {
                let mut h = u.down.lock().unwrap();
                h.until = Some(Instant::now());
            }
            assert!(u.take(), "the probe");
            assert!(!u.take() && !u.up(), "only one probe at a time");
            u.failed();
        }
        assert_eq!(u.down.lock().unwrap().backoff, BACKOFF.1);
        // A local failure gives the probe back; a success puts it in service.
        u.down.lock().unwrap().until = Some(Instant::now());
        assert!(u.take());
        u.untried();
        assert!(u.take());
        u.succeeded();
        assert!(u.up() && u.take());
    }
}
