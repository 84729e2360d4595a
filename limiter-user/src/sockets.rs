//! The kernel's TCP socket tables of this network namespace
//! (`/proc/net/tcp`, `/proc/net/tcp6`), read line by line and bounded:
//! the peers that completed a handshake (proof of source, for
//! escalation) and the listeners (SYN cookies' marking).

use std::{
    collections::HashSet,
    io::{BufRead as _, BufReader},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// Lines read of each of `/proc/net/tcp` and `/proc/net/tcp6` a refresh.
pub const MAX_SOCKETS: usize = 262_144;

/// The remote addresses of the namespace's TCP sockets past the
/// handshake (established or closing; not listening, not half-open) that
/// were accepted from a local listener: their local port is one the
/// namespace listens on (at their address or a wildcard). A connection
/// this host opened (a process's outgoing socket, on an ephemeral port)
/// proves nothing: a spoofer could flood from the address it talks to.
#[must_use]
pub fn connected_peers() -> HashSet<IpAddr> {
    let mut lines = Vec::new();
    tcp_sockets(|line| lines.push(line.to_owned()));
    accepted_peers(lines.iter().map(String::as_str))
}

/// [`connected_peers`] over the lines of `/proc/net/tcp{,6}`.
pub fn accepted_peers<'a>(lines: impl Iterator<Item = &'a str> + Clone) -> HashSet<IpAddr> {
    let listening: HashSet<(Option<IpAddr>, u16)> = lines.clone().filter_map(listening_on).collect();
    lines
        .filter_map(|line| {
            let (local, port) = local_of(line)?;
            let accepted = listening.contains(&(None, port)) || listening.contains(&(Some(local), port));
            if accepted { peer_of(line) } else { None }
        })
        .collect()
}

/// A listening socket's local address (`None`: a wildcard) and port.
fn listening_on(line: &str) -> Option<(Option<IpAddr>, u16)> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    if fields.nth(1)? != "0A" {
        return None;
    }
    let (hex, port) = local.split_once(':')?;
    let addr = unmapped(hex_addr(hex)?);
    Some(((!addr.is_unspecified()).then_some(addr), u16::from_str_radix(port, 16).ok()?))
}

/// A socket's local address and port.
fn local_of(line: &str) -> Option<(IpAddr, u16)> {
    let (hex, port) = line.split_whitespace().nth(1)?.split_once(':')?;
    Some((unmapped(hex_addr(hex)?), u16::from_str_radix(port, 16).ok()?))
}

/// A v4-mapped IPv6 address as the IPv4 address it is.
fn unmapped(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
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

/// The listening TCP sockets of this network namespace: (the address to
/// reach it at, port); a wildcard listener is reached on loopback.
#[must_use]
pub fn listeners() -> Vec<(IpAddr, u16)> {
    let mut out = Vec::new();
    tcp_sockets(|line| out.extend(listener_of(line)));
    out.sort();
    out.dedup();
    out
}

/// The local address and port of one line of `/proc/net/tcp{,6}`, if its
/// socket listens.
#[must_use]
pub fn listener_of(line: &str) -> Option<(IpAddr, u16)> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    if fields.nth(1)? != "0A" {
        return None;
    }
    let (hex, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let addr = match hex_addr(hex)? {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        a => a,
    };
    Some((addr, port))
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

    /// H3 of the third hardening round: a process of the host connecting
    /// out to an address made it "proven", and a spoofer flooding from it
    /// then had its /24 denied. Only a connection accepted from a local
    /// listener proves its peer.
    #[test]
    fn only_connections_accepted_from_a_local_listener_prove_their_peer() {
        if !cfg!(target_endian = "little") {
            return;
        }
        // Listening on 0.0.0.0:443 and on 198.18.0.2:8443 (and [::]:80).
        let any443 = "   0: 00000000:01BB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let at8443 = "   1: 020012C6:20FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let any6_80 = "   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0";
        // Accepted: 198.18.0.10 on :443, 198.18.0.11 on 198.18.0.2:8443,
        // 198.18.0.12 (v4-mapped) on [::]:80.
        let accepted_https = "   2: 020012C6:01BB 0A0012C6:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1";
        let accepted_api = "   3: 020012C6:20FB 0B0012C6:D432 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1";
        let accepted_web = "   1: 0000000000000000FFFF0000020012C6:0050 0000000000000000FFFF00000C0012C6:D433 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0";
        // Outgoing: from ephemeral port 40000 to 198.18.21.7:443, and to
        // 198.18.21.8:8443 from another local address.
        let out1 = "   4: 020012C6:9C40 071512C6:01BB 01 00000000:00000000 00:00000000 00000000 65534        0 1 1 0 20 4 30 10 -1";
        let out2 = "   5: 030012C6:20FB 081512C6:20FB 01 00000000:00000000 00:00000000 00000000 65534        0 1 1 0 20 4 30 10 -1";
        let lines = [any443, at8443, accepted_https, accepted_api, out1, out2];
        let v4 = accepted_peers(lines.iter().copied());
        let want: HashSet<IpAddr> = ["198.18.0.10", "198.18.0.11"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(v4, want);
        let v6 = accepted_peers([any6_80, accepted_web].iter().copied());
        assert_eq!(v6, ["198.18.0.12".parse().unwrap()].into_iter().collect());
    }

    #[test]
    fn listening_sockets_are_found_and_wildcards_reached_on_loopback() {
        let listen4 = "   0: 00000000:20FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let bound4 = "   1: 020012C6:20FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        let est = "   2: 020012C6:20FB 0A0012C6:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1";
        let listen6 = "   0: 00000000000000000000000000000000:20FB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0";
        if cfg!(target_endian = "little") {
            assert_eq!(listener_of(bound4), Some(("198.18.0.2".parse().unwrap(), 8443)));
        }
        assert_eq!(listener_of(listen4), Some(("127.0.0.1".parse().unwrap(), 8443)));
        assert_eq!(listener_of(listen6), Some(("::1".parse().unwrap(), 8443)));
        assert_eq!(listener_of(est), None);
    }
}
