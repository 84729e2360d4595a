//! The spoofing commands: raw Ethernet frames out of an interface, from
//! source addresses that are not this host's, bounded in count and time.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::MAX_PACKETS;

/// Send COUNT UDP frames, each from a different IPv4 source inside
/// 198.18.0.0/15 but above 198.18.4.0 (never the veth addresses nor the
/// fixed test sources in 198.18.1-3.x), out of IFACE as raw Ethernet
/// frames. Bounded by COUNT (at most 130,000).
pub fn spoof(iface: &str, mac: &str, dst: SocketAddr, count: u32) -> anyhow::Result<()> {
    let std::net::IpAddr::V4(dst_ip) = dst.ip() else { bail!("IPv4 only") };
    let mac = parse_mac(mac)?;
    let count = count.min(130_000);
    let (fd, addr) = packet_socket(iface, &mac)?;
    let (mut sent, mut retried) = (0u32, 0u32);
    let start = Instant::now();
    for i in 0..count {
        // 198.18.0.0/15 host i + 1024: from 198.18.4.0 on.
        let host = 1024 + i;
        let src = [198, 18 + u8::try_from(host >> 16)?, u8::try_from((host >> 8) & 0xff)?, u8::try_from(host & 0xff)?];
        let frame = udp_frame(&mac, src, dst_ip, (12345, dst.port()));
        // A frame the ring had no room for never reached the receiver's
        // program: sent again after a pause (on a loaded machine a CI run
        // lost 174 of 100,000), at most MAX_RETRIES times in all.
        loop {
            if send_frame(fd, &addr, &frame)? {
                sent += 1;
                break;
            }
            if retried == MAX_RETRIES {
                break;
            }
            retried += 1;
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    println!("sent {sent} secs {:.6} retried {retried}", start.elapsed().as_secs_f64());
    Ok(())
}

/// Sends `spoof` tries again, all frames together (at 50 us each: at
/// most 5 s of pauses).
const MAX_RETRIES: u32 = 100_000;

/// UDP to DST out of IFACE from each host of the /24 `net` (`A.B.C`) in
/// turn, paced at `pps` for `secs` (at most 60): a flood spoofed inside
/// one victim's prefix. Bounded by time and by MAX_PACKETS.
pub fn spoof_prefix(
    iface: &str,
    mac: &str,
    (dst, sport): (SocketAddr, u16),
    net: &str,
    pps: u64,
    secs: f64,
) -> anyhow::Result<()> {
    let dst_ip = match dst.ip() {
        std::net::IpAddr::V4(d) => d,
        std::net::IpAddr::V6(d) => return spoof_prefix6(iface, mac, (d, dst.port(), sport), net, pps, secs),
    };
    if net.contains(',') {
        return spoof_alternate(iface, mac, (dst_ip, dst.port(), sport), net, pps, secs);
    }
    let octets: Vec<u8> = net.split('.').map(str::parse).collect::<Result<_, _>>().context("A.B.C")?;
    // A /24 (`A.B.C`): each of its hosts in turn; a /16 (`A.B`): host 1
    // to 254 of each of its /24s in turn, every /24 one packet in 256.
    let source = |i: u64| -> anyhow::Result<[u8; 4]> {
        Ok(match octets[..] {
            [o1, o2, o3] => [o1, o2, o3, u8::try_from(i % 256)?],
            [o1, o2] => [o1, o2, u8::try_from(i % 256)?, u8::try_from(1 + (i / 256) % 254)?],
            _ => bail!("give the /24 as A.B.C or the /16 as A.B"),
        })
    };
    source(0)?;
    paced(iface, mac, pps, secs, |mac, i| Ok(udp_frame(mac, source(i)?, dst_ip, (sport, dst.port()))))
}

/// UDP from several /24s (`A.B.C,D.E.F,...`) packet by packet in turn,
/// host 1 to 254 of each: sources interleaved at equal rates, the case
/// a sampler that takes every Nth drop aliases on.
fn spoof_alternate(
    iface: &str,
    mac: &str,
    (dst, port, sport): (std::net::Ipv4Addr, u16, u16),
    nets: &str,
    pps: u64,
    secs: f64,
) -> anyhow::Result<()> {
    let nets = nets
        .split(',')
        .map(|n| {
            let o: Vec<u8> = n.split('.').map(str::parse).collect::<Result<_, _>>().context("A.B.C")?;
            match o[..] {
                [o1, o2, o3] => Ok([o1, o2, o3]),
                _ => bail!("give each /24 as A.B.C"),
            }
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let n = nets.len() as u64;
    paced(iface, mac, pps, secs, |mac, i| {
        let [o1, o2, o3] = nets[usize::try_from(i % n)?];
        let src = [o1, o2, o3, u8::try_from(1 + (i / n) % 254)?];
        Ok(udp_frame(mac, src, dst, (sport, port)))
    })
}

/// Frames out of IFACE to DST_MAC, frame `i` made by `frame(mac, i)`,
/// paced at `pps` for `secs` (at most 60); prints `sent N secs S`.
/// Bounded by time and by MAX_PACKETS.
fn paced(
    iface: &str,
    mac: &str,
    pps: u64,
    secs: f64,
    mut frame: impl FnMut(&[u8], u64) -> anyhow::Result<Vec<u8>>,
) -> anyhow::Result<()> {
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
        if send_frame(fd, &addr, &frame(&mac, i)?)? {
            sent += 1;
        }
        i += 1;
    }
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    println!("sent {sent} secs {:.6}", start.elapsed().as_secs_f64());
    Ok(())
}

/// TCP segments with `flags` (`None`: ACK, RST, FIN+ACK and data in
/// turn) to DST out of IFACE for SECS seconds (at most 60), each from the
/// next source of a range no test client uses: IPv4 hosts of
/// 198.18.4.0-198.19.255.255 (or of `net`), IPv6 hosts of
/// 2001:2:100::/40. Bounded by time and by MAX_PACKETS.
pub fn spoof_syn(
    iface: &str,
    mac: &str,
    dst: SocketAddr,
    secs: f64,
    flags: Option<u8>,
    net: Option<ipnet::Ipv4Net>,
) -> anyhow::Result<()> {
    use limiter_tests::packet::{ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_TCP};
    const MIXED: [u8; 4] = [0x10, 0x04, 0x11, 0x18];
    // The first source and how many: the net's hosts, or the flood range.
    let span = net.map_or((0xc612_0000 + 1024, 130_000), |n| {
        (u32::from(n.network()) + 1, u32::try_from(n.hosts().count()).unwrap_or(1).max(1))
    });
    let mac = parse_mac(mac)?;
    let (fd, addr) = packet_socket(iface, &mac)?;
    let until = Instant::now() + Duration::from_secs_f64(secs.clamp(0.0, 60.0));
    let (mut sent, start) = (0u64, Instant::now());
    let mut i = 0u32;
    while Instant::now() < until && sent < MAX_PACKETS {
        for _ in 0..1024 {
            i = i.wrapping_add(1);
            let flags = flags.unwrap_or(MIXED[i as usize % MIXED.len()]);
            let mut f = match dst.ip() {
                std::net::IpAddr::V4(d) => {
                    let (first, hosts) = span;
                    let src = std::net::Ipv4Addr::from(first + i % hosts);
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

/// [`spoof_prefix`] over IPv6: UDP from host 1, 2, ... of the /64 of
/// `net` (an IPv6 address, `2001:2:22::`) in turn.
fn spoof_prefix6(
    iface: &str,
    mac: &str,
    (dst, port, sport): (std::net::Ipv6Addr, u16, u16),
    net: &str,
    pps: u64,
    secs: f64,
) -> anyhow::Result<()> {
    use limiter_tests::packet::{ETH_P_IPV6, Frame, IPPROTO_UDP};
    let base =
        u128::from(net.parse::<std::net::Ipv6Addr>().context("an IPv6 /64 as 2001:2:22::")?) & !0xffff_ffff_ffff_ffff;
    paced(iface, mac, pps, secs, |mac, i| {
        let src = std::net::Ipv6Addr::from(base | u128::from(1 + i % 65_535));
        let mut f = Frame::eth(ETH_P_IPV6).ipv6(src, IPPROTO_UDP).udp_ports(sport, port).to_v6(dst).bytes;
        f[..6].copy_from_slice(mac);
        Ok(f)
    })
}

/// TCP ACK segments of one connection (`src` to `dst`, IPv4), paced at
/// `pps` for `secs` (at most 60): a host that floods over a connection
/// it holds, as raw frames (the kernel's own TCP would pace it).
pub fn tcp_flood(iface: &str, mac: &str, src: SocketAddr, dst: SocketAddr, pps: u64, secs: f64) -> anyhow::Result<()> {
    use limiter_tests::packet::{ETH_P_IP, Frame, IPPROTO_TCP};
    let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (src.ip(), dst.ip()) else { bail!("IPv4 only") };
    let mut f = Frame::eth(ETH_P_IP).ipv4(s, IPPROTO_TCP, 0, 0).tcp_to(dst.port(), 0x10).to_v4(d).on_the_wire();
    f[34..36].copy_from_slice(&src.port().to_be_bytes());
    paced(iface, mac, pps, secs, |mac, _| {
        f[..6].copy_from_slice(mac);
        tcp_checksum(&mut f);
        Ok(f.clone())
    })
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
