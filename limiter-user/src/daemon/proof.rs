//! Proof of source, for automatic escalation: an address is proven when
//! it completed a TCP handshake, either through a SYN cookie that the
//! program verified (its event carries the address) or with the kernel
//! (a connected TCP socket of the daemon's network namespace, read from
//! `/proc/net/tcp` and `/proc/net/tcp6`). Either needs the address to
//! receive our packets, which a spoofer cannot.
//!
//! Not taken as proof: that a prefix held a bucket before a flood began.
//! A spoofer picks the prefix of a real, active host exactly to get it
//! denied; the bucket proves that someone real lives there, not that the
//! flood comes from them.
//!
//! The sockets are read on a thread of their own, at most twice a second
//! and only while rate-limited drops are being seen, each file cut at
//! [`MAX_SOCKETS`] lines, so neither a busy host nor a flood stalls the
//! event loop.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead as _, BufReader},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
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
/// Lines read of each of `/proc/net/tcp` and `/proc/net/tcp6` a refresh.
pub const MAX_SOCKETS: usize = 262_144;

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
                let peers = connected_peers();
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

/// The remote addresses of the namespace's TCP sockets past the
/// handshake (established or closing; not listening, not half-open).
#[must_use]
pub fn connected_peers() -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    tcp_sockets(|line| out.extend(peer_of(line)));
    out
}

/// Each socket line of `/proc/net/tcp` and `/proc/net/tcp6` (this
/// network namespace's), at most [`MAX_SOCKETS`] of each.
pub fn tcp_sockets(mut each: impl FnMut(&str)) {
    for path in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(f) = std::fs::File::open(path) else { continue };
        for line in BufReader::new(f).lines().skip(1).take(MAX_SOCKETS) {
            let Ok(line) = line else { break };
            each(&line);
        }
    }
}

/// The remote address of one line of `/proc/net/tcp{,6}`, if its socket
/// completed a handshake. The kernel prints each 32-bit word of an address
/// in hex, in host byte order.
#[must_use]
pub fn peer_of(line: &str) -> Option<IpAddr> {
    let mut fields = line.split_whitespace();
    let remote = fields.nth(2)?;
    let state = u8::from_str_radix(fields.next()?, 16).ok()?;
    // ESTABLISHED, FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSE_WAIT, LAST_ACK,
    // CLOSING: all past the handshake. SYN_SENT (2), SYN_RECV (3), CLOSE
    // (7) and LISTEN (10) prove nothing.
    if !matches!(state, 1 | 4 | 5 | 6 | 8 | 9 | 11) {
        return None;
    }
    let (hex, _) = remote.split_once(':')?;
    match hex_addr(hex)? {
        // A v4 client of a dual-stack socket proves its v4 address.
        IpAddr::V6(v6) => Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)),
        v4 @ IpAddr::V4(_) => Some(v4),
    }
}

/// An address as `/proc/net/tcp{,6}` prints it: each 32-bit word in hex,
/// in host byte order (8 digits for IPv4, 32 for IPv6).
#[must_use]
pub fn hex_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| u32::from_str_radix(hex.get(8 * i..8 * i + 8)?, 16).ok().map(u32::to_ne_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_lines_give_the_peers_of_completed_handshakes() {
        // Lines as this kernel prints them (x86, little-endian words).
        let est4 = "   1: 020012C6:2328 0A0012C6:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1";
        let listen = "   0: 00000000:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let synrecv = "   2: 020012C6:2328 0B0012C6:D431 03 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1";
        let tw6 = "   0: 00000000000000000000000000000000:2328 02000120000000000000000007000000:D431 06 00000000:00000000 03:00000000 00000000     0        0 0 1 0";
        let mapped = "   0: 0000000000000000FFFF0000020012C6:2328 0000000000000000FFFF00000C0012C6:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0";
        if cfg!(target_endian = "little") {
            assert_eq!(peer_of(est4), Some("198.18.0.10".parse().unwrap()));
            assert_eq!(peer_of(tw6), Some("2001:2::7".parse().unwrap()));
            assert_eq!(peer_of(mapped), Some("198.18.0.12".parse().unwrap()));
        }
        assert_eq!(peer_of(listen), None);
        assert_eq!(peer_of(synrecv), None, "a half-open connection proves nothing");
        assert_eq!(peer_of("garbage"), None);
    }

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
