//! Keeping the kernel taking the ACKs of the SYN cookies XDP verified, and
//! saying when it does not. The kernel accepts a cookie ACK only within
//! two minutes of sending a cookie itself, and it sends none to a source
//! it cannot route to: on a host without a route back to a spoofed flood's
//! sources, the SYNs XDP hands it once a second (the flood's, mostly)
//! left it unmarked, and it answered every real client's verified ACK
//! with RST. So the daemon marks each listener itself: every
//! [`ARM_EVERY`] it sends one SYN from a raw socket to each listening
//! socket on a cookie class's ports, from the listener's own address (a
//! local, routable source; the packet never leaves the host nor passes
//! XDP), which the kernel answers with a cookie (`tcp_syncookies = 2`),
//! storing nothing; its SYN-ACK to a port nobody has is answered with RST
//! by the same kernel. And when XDP verifies cookies while the kernel's
//! `TcpExtSyncookiesRecv` does not move, the kernel is answering those
//! clients with RST: said in the status, a metric and one log line with
//! the remedy, per episode.

use std::{
    collections::VecDeque,
    net::IpAddr,
    time::{Duration, Instant},
};

/// How often each listener is marked (the kernel's mark lasts two minutes).
pub const ARM_EVERY: Duration = Duration::from_secs(30);
/// Listening sockets marked at most a round.
const MAX_LISTENERS: usize = 256;

/// Seconds of history judged.
const WINDOW: usize = 5;
/// Verified cookies in the window before a silent kernel is a failure.
const MIN_VERIFIED: u64 = 3;

#[derive(Debug, Default)]
pub(crate) struct CookieWatch {
    /// (XDP's `syn_cookie_verified` total, the kernel's `SyncookiesRecv`),
    /// one a second, oldest first.
    history: VecDeque<(u64, u64)>,
    /// Why cookie connections fail now, if they do.
    pub refusing: Option<String>,
    /// When the listeners were last marked.
    armed: Option<Instant>,
    /// Listeners marked in all.
    pub marked: u64,
    /// Why marking failed, said once.
    arm_failed: bool,
    /// XDP's `syn_cookie_to_kernel` and the kernel's `SyncookiesSent` a
    /// second ago: SYNs handed over that the kernel sent no cookie for
    /// (their sources unroutable) mean its mark may lapse: mark now.
    handed: Option<(u64, u64)>,
    remark: bool,
}

impl CookieWatch {
    /// Once a second: mark the listeners on `ports` if it is time.
    pub fn arm(&mut self, ports: &[(u16, u16)]) {
        let due = match self.armed {
            None => true,
            Some(t) => t.elapsed() >= ARM_EVERY || (self.remark && t.elapsed() >= Duration::from_secs(2)),
        };
        if ports.is_empty() || !due {
            return;
        }
        self.remark = false;
        self.armed = Some(Instant::now());
        let mut sent = 0;
        for (addr, port) in
            crate::sockets::listeners().into_iter().filter(|(_, p)| ports.iter().any(|(a, b)| (a..=b).contains(&p)))
        {
            match send_syn(addr, port, u16::try_from(40_000 + sent % 20_000).unwrap_or(40_000)) {
                Ok(()) => sent += 1,
                Err(e) if !self.arm_failed => {
                    self.arm_failed = true;
                    tracing::warn!(
                        event = "syn_cookies_arm",
                        "limiter: cannot mark the listener on {addr} port {port} for cookie ACKs ({e}); the kernel relies on the SYNs XDP hands it"
                    );
                }
                Err(_) => {}
            }
            if sent >= MAX_LISTENERS {
                break;
            }
        }
        self.marked += sent as u64;
    }

    /// Once a second while a class has SYN cookies: `verified` and
    /// `to_kernel` are XDP's totals; `kernel` the kernel's (`SyncookiesSent`,
    /// `SyncookiesRecv`), if it could be read.
    pub fn second(&mut self, verified: u64, to_kernel: u64, kernel: Option<(u64, u64)>) {
        let Some((sent, recv)) = kernel else { return };
        if let Some((t, s)) = self.handed
            && to_kernel > t
            && sent == s
        {
            self.remark = true;
        }
        self.handed = Some((to_kernel, sent));
        self.history.push_back((verified, recv));
        if self.history.len() > WINDOW {
            self.history.pop_front();
        }
        let (Some(first), Some(last)) = (self.history.front(), self.history.back()) else { return };
        let (xdp, kernel) = (last.0.saturating_sub(first.0), last.1.saturating_sub(first.1));
        if xdp >= MIN_VERIFIED && kernel == 0 {
            if self.refusing.is_none() {
                let why = format!(
                    "the kernel took none of the {xdp} cookie ACKs XDP verified in the last {} s (TcpExtSyncookiesRecv \
                     did not move): it answers them with RST, as it issued no cookie itself in two minutes, most \
                     likely because it has no route back to the SYNs' sources; give this interface a route back \
                     (a default route) or set syn_cookies = \"off\" for the class",
                    self.history.len() - 1
                );
                tracing::error!(event = "syn_cookies_refused", "limiter: SYN cookies FAIL: {why}");
                self.refusing = Some(why);
            }
        } else if kernel > 0 && self.refusing.take().is_some() {
            tracing::info!(event = "syn_cookies_refused", "limiter: the kernel takes cookie ACKs again");
        }
    }
}

/// A SYN to `addr`:`port` from `addr`:`sport`, through a raw socket.
fn send_syn(addr: IpAddr, port: u16, sport: u16) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let domain = if addr.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(domain, Type::from(libc::SOCK_RAW), Some(Protocol::TCP))?;
    let to = SockAddr::from(std::net::SocketAddr::new(addr, 0));
    s.bind(&to)?;
    let seq: u32 = 0x5eed_0000 | u32::from(sport);
    let mut h = [0u8; 24];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&port.to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[12] = 6 << 4;
    h[13] = 0x02;
    h[14..16].copy_from_slice(&1024u16.to_be_bytes());
    // MSS 1460.
    h[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
    if addr.is_ipv6() {
        // The kernel fills in the checksum of a raw IPv6 socket told where.
        let off: libc::c_int = 16;
        // SAFETY: setsockopt with a pointer to a c_int of its size.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::IPPROTO_IPV6,
                libc::IPV6_CHECKSUM,
                (&raw const off).cast(),
                libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    } else {
        let IpAddr::V4(a) = addr else { unreachable!("IPv4 here") };
        let sum = tcp_checksum(a.octets(), a.octets(), &h);
        h[16..18].copy_from_slice(&sum.to_be_bytes());
    }
    s.send_to(&h, &to)?;
    Ok(())
}

/// The TCP checksum of `seg` from `src` to `dst` (IPv4 pseudo-header).
fn tcp_checksum(src: [u8; 4], dst: [u8; 4], seg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&src);
    add(&dst);
    add(&[0, 6]);
    add(&u16::try_from(seg.len()).unwrap_or(0).to_be_bytes());
    add(seg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(0)
}

/// The kernel's `TcpExt: SyncookiesSent` and `SyncookiesRecv` from
/// `/proc/net/netstat` (this network namespace's).
#[must_use]
pub fn syncookies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    Some((netstat_field(&text, "TcpExt:", "SyncookiesSent")?, netstat_field(&text, "TcpExt:", "SyncookiesRecv")?))
}

/// A field of `/proc/net/netstat`: a header line of names, then a line of
/// values, both starting with `prefix`.
#[must_use]
pub fn netstat_field(text: &str, prefix: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marking_syn_checksum_folds_to_zero() {
        // RFC 1071 over a known header (the checksum field zero): folding
        // the result in gives zero.
        let mut h = [0u8; 20];
        h[12] = 5 << 4;
        h[13] = 2;
        let c = tcp_checksum([127, 0, 0, 1], [127, 0, 0, 1], &h);
        h[16..18].copy_from_slice(&c.to_be_bytes());
        assert_eq!(tcp_checksum([127, 0, 0, 1], [127, 0, 0, 1], &h), 0);
    }

    #[test]
    fn a_kernel_that_takes_no_verified_cookie_is_reported_until_it_does() {
        let text =
            "TcpExt: SyncookiesSent SyncookiesRecv SyncookiesFailed\nTcpExt: 4 17 2\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(netstat_field(text, "TcpExt:", "SyncookiesRecv"), Some(17));
        assert_eq!(netstat_field(text, "TcpExt:", "Nope"), None);
        let mut w = CookieWatch::default();
        // Verified in XDP, taken by the kernel: fine.
        for s in 0..6 {
            w.second(10 * s, s, Some((s, 10 * s)));
        }
        assert!(w.refusing.is_none() && !w.remark);
        // Verified in XDP, the kernel silent: reported; and SYNs handed
        // over that the kernel sent no cookie for: marked again.
        for s in 6..12 {
            w.second(10 * s, s, Some((5, 50)));
        }
        assert!(w.refusing.as_deref().is_some_and(|r| r.contains("route back")), "{:?}", w.refusing);
        assert!(w.remark);
        // The kernel takes them again.
        w.second(130, 12, Some((6, 60)));
        assert!(w.refusing.is_none());
        // Nothing verified: nothing to say.
        let mut quiet = CookieWatch::default();
        for _ in 0..10 {
            quiet.second(5, 1, Some((1, 5)));
        }
        assert!(quiet.refusing.is_none() && !quiet.remark);
    }
}
