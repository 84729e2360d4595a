//! Who is on the other end of a connection, for sharing a listener's
//! slots fairly: the uid on a Unix socket (`SO_PEERCRED`); on TCP the
//! peer's address, and, when the peer is a socket of this host (loopback
//! or one of its own addresses), also the uid that owns that socket, asked
//! of the kernel through `NETLINK_SOCK_DIAG`. Without the uid every local
//! user would share `127.0.0.1`, and one of them could take a local
//! Prometheus's share.

use std::{
    fmt, io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

/// A peer's identity: what a listener's share and rate limits are kept by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A Unix socket's client.
    Uid(u32),
    /// A TCP client on another host.
    Addr(IpAddr),
    /// A TCP client on this host, with the uid that owns its socket.
    Local(IpAddr, u32),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uid(u) => write!(f, "uid {u}"),
            Self::Addr(a) => write!(f, "{a}"),
            Self::Local(a, u) => write!(f, "{a} (uid {u})"),
        }
    }
}

/// The identity of a TCP peer at `peer` connected to our `local`.
#[must_use]
pub fn tcp(local: SocketAddr, peer: SocketAddr) -> Peer {
    let ip = peer.ip().to_canonical();
    match owner_uid(local, peer) {
        Ok(Some(uid)) => Peer::Local(ip, uid),
        _ => Peer::Addr(ip),
    }
}

/// A reply is given at once (the kernel answers a netlink request
/// synchronously); this only bounds a kernel that does not.
const DIAG_TIMEOUT: Duration = Duration::from_millis(50);

/// The uid owning the TCP socket at `peer` whose remote end is `local`, if
/// that socket is on this host (in this network namespace).
fn owner_uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    if local.is_ipv4() != peer.is_ipv4() {
        return Ok(None);
    }
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv =
        libc::timeval { tv_sec: 0, tv_usec: libc::suseconds_t::try_from(DIAG_TIMEOUT.as_micros()).unwrap_or(50_000) };
    // SAFETY: setsockopt with a timeval we own and its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            u32::try_from(size_of::<libc::timeval>()).unwrap_or(16),
        );
    }
    let req = request(local, peer);
    // SAFETY: sending a buffer we own to the kernel (nl_pid 0).
    let sent = unsafe {
        let mut to: libc::sockaddr_nl = std::mem::zeroed();
        to.nl_family = u16::try_from(libc::AF_NETLINK).unwrap_or(16);
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&raw const to).cast(),
            u32::try_from(size_of::<libc::sockaddr_nl>()).unwrap_or(12),
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 512];
    // SAFETY: receiving into a buffer we own, with its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    Ok(parse(&buf[..n]))
}

/// `SOCK_DIAG_BY_FAMILY`, an `inet_diag_req_v2` for exactly one socket:
/// the one whose source is `peer` and destination `local`.
fn request(local: SocketAddr, peer: SocketAddr) -> Vec<u8> {
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    let mut m = Vec::with_capacity(72);
    let len: u32 = 16 + 56;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&u16::try_from(libc::NLM_F_REQUEST).unwrap_or(1).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid
    let family = if peer.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    m.push(u8::try_from(family).unwrap_or(2));
    m.push(u8::try_from(libc::IPPROTO_TCP).unwrap_or(6));
    m.push(0); // ext
    m.push(0); // pad
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    // inet_diag_sockid: ports and addresses in network order.
    m.extend_from_slice(&peer.port().to_be_bytes());
    m.extend_from_slice(&local.port().to_be_bytes());
    for ip in [peer.ip(), local.ip()] {
        let mut a = [0u8; 16];
        match ip {
            IpAddr::V4(v) => a[..4].copy_from_slice(&v.octets()),
            IpAddr::V6(v) => a.copy_from_slice(&v.octets()),
        }
        m.extend_from_slice(&a);
    }
    m.extend_from_slice(&0u32.to_ne_bytes()); // interface
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    m
}

/// The uid in an `inet_diag_msg` reply; `None` for an error (no such
/// socket here: the peer is on another host).
fn parse(reply: &[u8]) -> Option<u32> {
    const HDR: usize = 16;
    const UID_AT: usize = HDR + 4 + 48 + 12;
    let kind = u16::from_ne_bytes(reply.get(4..6)?.try_into().ok()?);
    if kind != 20 {
        return None;
    }
    Some(u32::from_ne_bytes(reply.get(UID_AT..UID_AT + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    #[test]
    fn a_local_peer_is_known_by_its_uid_on_both_families() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = std::net::TcpListener::bind(bind) else { continue };
            let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, peer) = l.accept().unwrap();
            assert_eq!(peer, c.local_addr().unwrap());
            let got = tcp(s.local_addr().unwrap(), peer);
            assert_eq!(got, Peer::Local(peer.ip(), uid()), "{bind}");
        }
    }

    #[test]
    fn a_socket_that_is_not_here_is_known_by_its_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // No socket has this source port connected to the listener.
        let ghost: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(tcp(l.local_addr().unwrap(), ghost), Peer::Addr(ghost.ip()));
    }
}
