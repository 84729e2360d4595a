//! Proof of source, for automatic escalation: an address is proven when
//! it completed a TCP handshake, either through a SYN cookie that the
//! program verified (its event carries the address) or with the kernel
//! (a connected TCP socket of the daemon's network namespace accepted
//! from a local listener, read from `/proc/net/tcp` and `/proc/net/tcp6`;
//! a connection the host opened itself proves nothing). Either needs the
//! address to receive our packets, which a spoofer cannot.
//!
//! Not taken as proof: that a prefix held a bucket before a flood began.
//! A spoofer picks the prefix of a real, active host exactly to get it
//! denied; the bucket proves that someone real lives there, not that the
//! flood comes from them.
//!
//! The sockets are read ([`crate::sockets`]) on a thread of their own, at
//! most twice a second and only while rate-limited drops are being seen,
//! so neither a busy host nor a flood stalls the event loop.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// How long an address stays proven after it was last seen proving it.
pub const PROOF_TTL_SECS: u64 = 600;
/// Most addresses kept proven at once (a handshake each: bounded by what
/// the host accepted, but bounded here too).
pub const MAX_PROVEN: usize = 65_536;

/// The addresses that proved themselves, with the Unix time each was last
/// seen doing so.
#[derive(Debug, Default)]
pub struct Proven {
    seen: HashMap<IpAddr, u64>,
    /// The kernel's connected peers, as last read in the background.
    sockets: Option<SocketReader>,
}

impl Proven {
    /// With a background reader of the kernel's TCP sockets.
    #[must_use]
    pub fn with_sockets() -> Self {
        Self { seen: HashMap::new(), sockets: Some(SocketReader::spawn()) }
    }

    /// `addr` proved itself at `now`.
    pub fn prove(&mut self, addr: IpAddr, now: u64) {
        if self.seen.len() >= MAX_PROVEN && !self.seen.contains_key(&addr) {
            self.seen.retain(|_, t| now.saturating_sub(*t) < 60);
            if self.seen.len() >= MAX_PROVEN {
                return;
            }
        }
        self.seen.insert(addr, now);
    }

    /// Whether `addr` proved itself within [`PROOF_TTL_SECS`] of `now`.
    #[must_use]
    pub fn contains(&self, addr: &IpAddr) -> bool {
        self.seen.contains_key(addr)
    }

    /// Rate-limited drops are being seen: refresh the kernel's sockets soon.
    pub fn wanted(&self) {
        if let Some(s) = &self.sockets {
            s.wanted.store(true, Ordering::Relaxed);
        }
    }

    /// Once a second: take in the sockets last read, forget old proofs.
    pub fn tick(&mut self, now: u64) {
        let read = self.sockets.as_ref().and_then(|s| s.latest.lock().ok().and_then(|mut l| l.take()));
        for addr in read.into_iter().flatten() {
            self.prove(addr, now);
        }
        self.seen.retain(|_, t| now.saturating_sub(*t) < PROOF_TTL_SECS);
    }

    /// How many addresses are proven now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no address is proven now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Reads the connected peers of the kernel's TCP sockets when asked.
#[derive(Debug)]
struct SocketReader {
    wanted: Arc<AtomicBool>,
    latest: Arc<Mutex<Option<HashSet<IpAddr>>>>,
}

impl SocketReader {
    fn spawn() -> Self {
        let wanted = Arc::new(AtomicBool::new(false));
        let latest = Arc::new(Mutex::new(None));
        let (w, l) = (Arc::clone(&wanted), Arc::clone(&latest));
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(100));
                if !w.swap(false, Ordering::Relaxed) {
                    continue;
                }
                let peers = crate::sockets::connected_peers();
                if let Ok(mut slot) = l.lock() {
                    slot.get_or_insert_with(HashSet::new).extend(peers);
                }
                // At most twice a second.
                std::thread::sleep(Duration::from_millis(400));
            }
        });
        Self { wanted, latest }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn proofs_expire_and_stay_bounded() {
        let mut p = Proven::default();
        let a: IpAddr = "198.18.0.10".parse().unwrap();
        p.prove(a, 100);
        p.tick(100 + PROOF_TTL_SECS - 1);
        assert!(p.contains(&a));
        p.tick(100 + PROOF_TTL_SECS);
        assert!(!p.contains(&a));
        for i in 0..u32::try_from(MAX_PROVEN).unwrap() + 10 {
            p.prove(IpAddr::V4(Ipv4Addr::from(i)), 1000);
        }
        assert_eq!(p.len(), MAX_PROVEN);
    }
}
