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
//!                                                   the /24 A.B.C.0 in turn,
//!                                                   PPS a second for SECS,
//!                                                   from port SPORT, 12345
//!                                                   unless given)
//!   netload spoof-tcp IFACE DST_MAC DST_IP:PORT SECS FLAGS
//!                                                  (the same with the TCP
//!                                                   flags FLAGS, in hex)
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
//! `send` prints `sent N secs S`; `recv` prints `ready`, then after SECS one
//! `from ADDR N` line per source and `total N`.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

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
            spoof_syn(iface, mac, dst.parse().context("DST_IP:PORT")?, secs.parse().context("SECS")?, 0x02)
        }
        ["spoof-tcp", iface, mac, dst, secs, flags] => {
            let flags = u8::from_str_radix(flags.trim_start_matches("0x"), 16).context("FLAGS (hex)")?;
            spoof_syn(iface, mac, dst.parse().context("DST_IP:PORT")?, secs.parse().context("SECS")?, flags)
        }
        ["spoof-prefix", iface, mac, dst, net, pps, secs, sport @ ..] if sport.len() <= 1 => spoof_prefix(
            iface,
            mac,
            (dst.parse().context("DST_IP:PORT")?, sport.first().map_or(Ok(12345), |p| p.parse()).context("SPORT")?),
            net,
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

/// Send COUNT UDP frames, each from a different IPv4 source inside
/// 198.18.0.0/15 but above 198.18.4.0 (never the veth addresses nor the
/// fixed test sources in 198.18.1-3.x), out of IFACE as raw Ethernet
/// frames. Bounded by COUNT (at most 130,000).
fn spoof(iface: &str, mac: &str, dst: SocketAddr, count: u32) -> anyhow::Result<()> {
    let std::net::IpAddr::V4(dst_ip) = dst.ip() else { bail!("IPv4 only") };
    let mac = parse_mac(mac)?;
    let count = count.min(130_000);
    let (fd, addr) = packet_socket(iface, &mac)?;
    let mut sent = 0u32;
    let start = Instant::now();
    for i in 0..count {
        // 198.18.0.0/15 host i + 1024: from 198.18.4.0 on.
        let host = 1024 + i;
        let src = [198, 18 + u8::try_from(host >> 16)?, u8::try_from((host >> 8) & 0xff)?, u8::try_from(host & 0xff)?];
        let frame = udp_frame(&mac, src, dst_ip, (12345, dst.port()));
        if send_frame(fd, &addr, &frame)? {
            sent += 1;
        }
    }
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    println!("sent {sent} secs {:.6}", start.elapsed().as_secs_f64());
    Ok(())
}

/// UDP to DST out of IFACE from each host of the /24 `net` (`A.B.C`) in
/// turn, paced at `pps` for `secs` (at most 60): a flood spoofed inside
/// one victim's prefix. Bounded by time and by MAX_PACKETS.
fn spoof_prefix(
    iface: &str,
    mac: &str,
    (dst, sport): (SocketAddr, u16),
    net: &str,
    pps: u64,
    secs: f64,
) -> anyhow::Result<()> {
    let std::net::IpAddr::V4(dst_ip) = dst.ip() else { bail!("IPv4 only") };
    let octets: Vec<u8> = net.split('.').map(str::parse).collect::<Result<_, _>>().context("A.B.C")?;
    let [o1, o2, o3] = octets[..] else { bail!("give the /24 as A.B.C") };
    let mac = parse_mac(mac)?;
    let (fd, addr) = packet_socket(iface, &mac)?;
    let dur = Duration::from_secs_f64(secs.clamp(0.0, 60.0));
    let (start, mut sent, mut i) = (Instant::now(), 0u64, 0u64);
    while start.elapsed() < dur && i < MAX_PACKETS {
        // Paced: packet i leaves at i / pps seconds.
        #[expect(clippy::cast_precision_loss, reason = "pacing only")]
        let due = Duration::from_secs_f64(i as f64 / pps.max(1) as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let frame = udp_frame(&mac, [o1, o2, o3, u8::try_from(i % 256)?], dst_ip, (sport, dst.port()));
        if send_frame(fd, &addr, &frame)? {
            sent += 1;
        }
        i += 1;
    }
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    println!("sent {sent} secs {:.6}", start.elapsed().as_secs_f64());
    Ok(())
}

/// TCP SYNs to DST out of IFACE for SECS seconds (at most 60), each from
/// the next source of a range no test client uses: IPv4 hosts of
/// 198.18.4.0-198.19.255.255, IPv6 hosts of 2001:2:100::/40. Bounded by
/// time and by MAX_PACKETS.
fn spoof_syn(iface: &str, mac: &str, dst: SocketAddr, secs: f64, flags: u8) -> anyhow::Result<()> {
    use limiter_tests::packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_TCP};
    let mac = parse_mac(mac)?;
    let (fd, addr) = packet_socket(iface, &mac)?;
    let until = Instant::now() + Duration::from_secs_f64(secs.clamp(0.0, 60.0));
    let (mut sent, start) = (0u64, Instant::now());
    let mut i = 0u32;
    while Instant::now() < until && sent < MAX_PACKETS {
        for _ in 0..1024 {
            i = i.wrapping_add(1);
            let mut f = match dst.ip() {
                std::net::IpAddr::V4(d) => {
                    let host = 1024 + i % 130_000;
                    let src = std::net::Ipv4Addr::from(0xc612_0000 + host);
                    let mut f =
                        Frame::eth(ETH_P_IP).ipv4(src, IPPROTO_TCP, 0, 0).tcp_to(dst.port(), flags).on_the_wire();
                    f[30..34].copy_from_slice(&d.octets());
                    f
                }
                std::net::IpAddr::V6(d) => {
                    let src = std::net::Ipv6Addr::from(
                        0x2001_0002_0100_0000_0000_0000_0000_0000u128 | (u128::from(i) << 64) | 7,
                    );
                    let mut f = Frame::eth(ETH_P_IPV6).ipv6(src, IPPROTO_TCP).tcp_to(dst.port(), flags).bytes;
                    f[18..20].copy_from_slice(&20u16.to_be_bytes());
                    f[38..54].copy_from_slice(&d.octets());
                    f
                }
            };
            f[..6].copy_from_slice(&mac);
            tcp_checksum(&mut f);
            if send_frame(fd, &addr, &f)? {
                sent += 1;
            }
        }
    }
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    println!("sent {sent} secs {:.6}", start.elapsed().as_secs_f64());
    Ok(())
}

/// Fill in the TCP checksum of an Ethernet + IPv4 (no options) or IPv6 +
/// TCP frame, so that a receiving stack takes the segment.
fn tcp_checksum(f: &mut [u8]) {
    let v6 = f[12..14] == [0x86, 0xdd];
    let (addrs, l4) = if v6 { (22..54, 54) } else { (26..34, 34) };
    f[l4 + 16..l4 + 18].fill(0);
    let len = u32::try_from(f.len() - l4).expect("a short frame");
    let mut acc = 6 + len;
    for w in f[addrs].chunks(2).chain(f[l4..].chunks(2)) {
        acc += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    let sum = !u16::try_from(acc).expect("folded");
    f[l4 + 16..l4 + 18].copy_from_slice(&sum.to_be_bytes());
}

/// `aa:bb:cc:dd:ee:ff` as six bytes.
fn parse_mac(mac: &str) -> anyhow::Result<Vec<u8>> {
    let mac: Vec<u8> =
        mac.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>().context("DST_MAC")?;
    anyhow::ensure!(mac.len() == 6, "DST_MAC must have 6 bytes");
    Ok(mac)
}

/// Send one frame on an AF_PACKET socket; whether the kernel took it.
fn send_frame(fd: i32, addr: &libc::sockaddr_ll, frame: &[u8]) -> anyhow::Result<bool> {
    let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>())?;
    // SAFETY: frame and addr are valid for the lengths given.
    let rc = unsafe { libc::sendto(fd, frame.as_ptr().cast(), frame.len(), 0, std::ptr::from_ref(addr).cast(), len) };
    Ok(rc > 0)
}

/// An AF_PACKET socket and the address that sends out of `iface` to `mac`.
fn packet_socket(iface: &str, mac: &[u8]) -> anyhow::Result<(i32, libc::sockaddr_ll)> {
    let name = std::ffi::CString::new(iface)?;
    // SAFETY: plain libc calls on values we own.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    anyhow::ensure!(ifindex != 0, "no interface {iface}");
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    anyhow::ensure!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET)?;
    addr.sll_ifindex = i32::try_from(ifindex)?;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(mac);
    Ok((fd, addr))
}

fn udp_frame(dst_mac: &[u8], src: [u8; 4], dst: std::net::Ipv4Addr, (sport, port): (u16, u16)) -> Vec<u8> {
    use limiter_tests::packet::{ETH_P_IP, Frame, IPPROTO_UDP};
    let mut f = Frame::eth(ETH_P_IP).ipv4(src.into(), IPPROTO_UDP, 0, 0).udp_ports(sport, port).payload(4);
    f.bytes[..6].copy_from_slice(dst_mac);
    f.bytes[30..34].copy_from_slice(&dst.octets());
    f.on_the_wire()
}
