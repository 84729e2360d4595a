//! Test traffic over UDP, bounded in count and time.
//!
//!   netload send SRC DST:PORT PPS SECS [PAYLOAD]   (PPS 0 = as fast as possible)
//!   netload recv BIND:PORT SECS
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
        ["recv", bind, secs] => recv(bind.parse().context("BIND:PORT")?, secs.parse().context("SECS")?),
        _ => bail!("usage: netload send SRC DST:PORT PPS SECS [PAYLOAD] | netload recv BIND:PORT SECS"),
    }
}

fn send(src: &str, dst: SocketAddr, pps: u64, secs: f64, payload: usize) -> anyhow::Result<()> {
    let sock = UdpSocket::bind((src, 0)).with_context(|| format!("bind {src}"))?;
    sock.connect(dst)?;
    let buf = vec![0x5a; payload];
    let dur = Duration::from_secs_f64(secs.clamp(0.0, 600.0));
    let start = Instant::now();
    let (mut sent, mut attempts) = (0u64, 0u64);
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
        if sock.send(&buf).is_ok() {
            sent += 1;
        }
    }
    println!("sent {sent} secs {:.6}", start.elapsed().as_secs_f64());
    Ok(())
}

fn recv(bind: SocketAddr, secs: f64) -> anyhow::Result<()> {
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
    let deadline = Instant::now() + Duration::from_secs_f64(secs.clamp(0.0, 600.0));
    let mut counts: BTreeMap<std::net::IpAddr, u64> = BTreeMap::new();
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        if let Ok((_, from)) = sock.recv_from(&mut buf) {
            *counts.entry(from.ip()).or_default() += 1;
        }
    }
    for (ip, n) in &counts {
        println!("from {ip} {n}");
    }
    println!("total {}", counts.values().sum::<u64>());
    Ok(())
}
