//! Test traffic over UDP, bounded in count and time.
//!
//!   netload send SRC DST:PORT PPS SECS [PAYLOAD]   (PPS 0 = as fast as possible)
//!   netload recv BIND:PORT SECS
//!   netload spoof IFACE DST_MAC DST_IP:PORT COUNT  (COUNT distinct IPv4 sources
//!                                                   in 198.18.4.0-198.19.255.255)
//!   netload spoof-syn IFACE DST_MAC DST_IP:PORT SECS (TCP SYNs from ever new
//!                                                   sources, IPv4 as above or
//!                                                   IPv6 in 2001:2:100::/40,
//!                                                   as fast as it can for SECS)
//!   netload spoof-prefix IFACE DST_MAC DST_IP:PORT A.B.C PPS SECS [SPORT]
//!                                                  (UDP from every host of
//!                                                   the /24 A.B.C.0 in turn
//!                                                   (or, given A.B, of every
//!                                                   /24 of A.B.0.0/16,
//!                                                   or, given A.B.C,D.E.F,
//!                                                   packet by packet from
//!                                                   each /24 in turn),
//!                                                   PPS a second for SECS,
//!                                                   from port SPORT, 12345
//!                                                   unless given; to an
//!                                                   IPv6 DST, from each
//!                                                   host of the /64 of
//!                                                   A, an IPv6 address)
//!   netload spoof-tcp IFACE DST_MAC DST_IP:PORT SECS FLAGS
//!                                                  (the same with the TCP
//!                                                   flags FLAGS, in hex)
//!   netload tcp-flood IFACE DST_MAC SRC:PORT DST:PORT PPS SECS
//!                                                  (TCP ACKs of one
//!                                                   connection, PPS a
//!                                                   second for SECS)
//!   netload get HOST:PORT PATH                     (HTTP GET, prints the body)
//!   netload hold TARGET COUNT SECS MODE            (a hostile client: holds
//!                                                   COUNT connections to
//!                                                   tcp:HOST:PORT or
//!                                                   unix:PATH, reopening
//!                                                   the oldest ~500 times a
//!                                                   second for SECS; MODE
//!                                                   idle, slow (a partial
//!                                                   request) or scrape (50
//!                                                   pipelined GET /metrics))
//!
//! `send` prints `sent N secs S`; `spoof` `sent N secs S retried R` (a
//! frame the ring refused is sent again, a bounded number of times);
//! `recv` prints `ready`, then after SECS one `from ADDR N` line per
//! source and `total N`.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use self::spoof::{spoof, spoof_prefix, spoof_syn, tcp_flood};

/// Raw Ethernet frames from addresses that are not this host's.
mod spoof;

/// Hard cap on packets one `send` may emit, whatever it is asked.
const MAX_PACKETS: u64 = 50_000_000;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["send", src, dst, pps, secs, rest @ ..] => {
            let payload = rest.first().map_or(Ok(18), |p| p.parse()).context("PAYLOAD")?;
            send(
                src,
                dst.parse().context("DST:PORT")?,
                pps.parse().context("PPS")?,
                secs.parse().context("SECS")?,
                payload,
            )
        }
        ["recv", bind, secs] => recv(bind.parse().context("BIND:PORT")?, secs.parse().context("SECS")?, u64::MAX),
        ["recv", bind, secs, expect] => {
            recv(bind.parse().context("BIND:PORT")?, secs.parse().context("SECS")?, expect.parse().context("EXPECT")?)
        }
        ["spoof", iface, mac, dst, count] => spoof(iface, mac, dst.parse().context("DST_IP:PORT")?, count.parse()?),
        ["spoof-syn", iface, mac, dst, secs] => {
            spoof_syn(iface, mac, dst.parse().context("DST_IP:PORT")?, secs.parse().context("SECS")?, Some(0x02), None)
        }
        ["spoof-tcp", iface, mac, dst, secs, flags, net @ ..] if net.len() <= 1 => {
            // `mixed`: ACK, RST, FIN and data segments in turn.
            let flags = match *flags {
                "mixed" => None,
                f => Some(u8::from_str_radix(f.trim_start_matches("0x"), 16).context("FLAGS (hex, or mixed)")?),
            };
            let net = net.first().map(|n| n.parse::<ipnet::Ipv4Net>().context("an IPv4 NET/LEN")).transpose()?;
            spoof_syn(iface, mac, dst.parse().context("DST_IP:PORT")?, secs.parse().context("SECS")?, flags, net)
        }
        ["spoof-prefix", iface, mac, dst, net, pps, secs, sport @ ..] if sport.len() <= 1 => spoof_prefix(
            iface,
            mac,
            (dst.parse().context("DST_IP:PORT")?, sport.first().map_or(Ok(12345), |p| p.parse()).context("SPORT")?),
            net,
            pps.parse().context("PPS")?,
            secs.parse().context("SECS")?,
        ),
        ["tcp-flood", iface, mac, src, dst, pps, secs] => tcp_flood(
            iface,
            mac,
            src.parse().context("SRC:PORT")?,
            dst.parse().context("DST:PORT")?,
            pps.parse().context("PPS")?,
            secs.parse().context("SECS")?,
        ),
        ["get", addr, path] => get(addr, path),
        ["hold", target, count, secs, mode] => {
            hold(target, count.parse()?, secs.parse()?, mode);
            Ok(())
        }
        _ => bail!("usage: netload send SRC DST:PORT PPS SECS [PAYLOAD] | netload recv BIND:PORT SECS [EXPECT]"),
    }
}

fn send(src: &str, dst: SocketAddr, pps: u64, secs: f64, payload: usize) -> anyhow::Result<()> {
    let sock = UdpSocket::bind((src, 0)).with_context(|| format!("bind {src}"))?;
    sock.connect(dst)?;
    report_full_rings(&sock, dst)?;
    let buf = vec![0x5a; payload];
    let dur = Duration::from_secs_f64(secs.clamp(0.0, 600.0));
    let start = Instant::now();
    let (mut sent, mut attempts, mut ring_full, mut failed) = (0u64, 0u64, 0u64, 0u64);
    while attempts < MAX_PACKETS {
        let elapsed = start.elapsed();
        if elapsed >= dur {
            break;
        }
        if pps > 0 {
            // Pace: never ahead of pps * elapsed.
            let due = elapsed.as_nanos() * u128::from(pps) / 1_000_000_000 + 1;
            if u128::from(attempts) >= due {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        attempts += 1;
        match sock.send(&buf) {
            Ok(_) => sent += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => ring_full += 1,
            Err(_) => failed += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("sent {sent} secs {secs:.6} ring_full {ring_full} failed {failed}");
    Ok(())
}

/// Make a send that the interface dropped (a veth whose peer's ring is
/// full) fail with ENOBUFS instead of the kernel's silent success, so
/// "sent" counts only frames the receiving side's XDP program saw.
fn report_full_rings(sock: &UdpSocket, dst: SocketAddr) -> anyhow::Result<()> {
    let (level, name) =
        if dst.is_ipv4() { (libc::IPPROTO_IP, libc::IP_RECVERR) } else { (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) };
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on our own socket with a valid int.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const on).cast(),
            libc::socklen_t::try_from(size_of::<libc::c_int>())?,
        )
    };
    anyhow::ensure!(rc == 0, "IP_RECVERR: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Count what arrives for `secs` (from the first packet, if that came
/// late), or until `expect` packets have.
fn recv(bind: SocketAddr, secs: f64, expect: u64) -> anyhow::Result<()> {
    let sock = UdpSocket::bind(bind).with_context(|| format!("bind {bind}"))?;
    // A large receive buffer: the receiver must never be the one dropping.
    let size: libc::c_int = 16 << 20;
    // SAFETY: setsockopt on our own socket with a valid int.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            libc::socklen_t::try_from(size_of::<libc::c_int>())?,
        );
    }
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    println!("ready");
    let window = Duration::from_secs_f64(secs.clamp(0.0, 600.0));
    let mut deadline = Instant::now() + window;
    let mut counts: BTreeMap<std::net::IpAddr, u64> = BTreeMap::new();
    let mut buf = [0u8; 2048];
    let mut total = 0;
    while Instant::now() < deadline && total < expect {
        if let Ok((_, from)) = sock.recv_from(&mut buf) {
            if total == 0 {
                // A sender that started late still gets the whole window.
                deadline = deadline.max(Instant::now() + window);
            }
            *counts.entry(from.ip()).or_default() += 1;
            total += 1;
        }
    }
    for (ip, n) in &counts {
        println!("from {ip} {n}");
    }
    println!("total {}", counts.values().sum::<u64>());
    Ok(())
}

/// HTTP/1.0 GET; print the body.
fn get(addr: &str, path: &str) -> anyhow::Result<()> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").context("no HTTP header end")?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        bail!("{}", head.lines().next().unwrap_or("no status"));
    }
    print!("{body}");
    Ok(())
}

/// A connection of `hold`'s.
enum Held {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl std::io::Read for Held {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(b),
            Self::Unix(s) => s.read(b),
        }
    }
}

impl std::io::Write for Held {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(b),
            Self::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hold up to COUNT (at most 1,000) connections for SECS (at most 120),
/// closing the oldest and opening a new one every 2 ms; prints `opened N
/// failed F ok200 X too_many Y`.
fn hold(target: &str, count: usize, secs: f64, mode: &str) {
    use std::io::{Read as _, Write as _};
    let (count, secs) = (count.min(1000), secs.min(120.0));
    let connect = || -> std::io::Result<Held> {
        if let Some(a) = target.strip_prefix("tcp:") {
            let s = std::net::TcpStream::connect(a)?;
            s.set_read_timeout(Some(Duration::from_millis(2)))?;
            Ok(Held::Tcp(s))
        } else {
            let s = std::os::unix::net::UnixStream::connect(target.strip_prefix("unix:").unwrap_or(target))?;
            s.set_read_timeout(Some(Duration::from_millis(2)))?;
            Ok(Held::Unix(s))
        }
    };
    let scrape = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(50);
    let partial: &[u8] = if target.starts_with("tcp:") { b"GET /metrics HTTP/1.1\r\nHo" } else { b"{\"" };
    let mut held = std::collections::VecDeque::new();
    let (mut opened, mut failed, mut ok, mut too_many) = (0u64, 0u64, 0u64, 0u64);
    let mut buf = vec![0u8; 1 << 16];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        if held.len() >= count {
            held.pop_front();
        }
        match connect() {
            Ok(mut c) => {
                opened += 1;
                let _ = match mode {
                    "slow" => c.write_all(partial),
                    "scrape" => c.write_all(scrape.as_bytes()),
                    _ => Ok(()),
                };
                held.push_back(c);
            }
            Err(_) => failed += 1,
        }
        if mode == "scrape" {
            for c in &mut held {
                if let Ok(n) = c.read(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    ok += text.matches("HTTP/1.1 200").count() as u64;
                    too_many += text.matches("HTTP/1.1 429").count() as u64;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    println!("opened {opened} failed {failed} ok200 {ok} too_many {too_many}");
}
