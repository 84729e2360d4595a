//! Bench `forward`, the limiter's own costs: memory per idle connection,
//! and the CPU of a connection refused at the cap.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use limiter_tests::{
    netns::{NetNs, VethPair},
    scenario,
};

use super::{clients, reset_on_close, wait_port};

/// CPU time (user + system) of `pid` in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Idle connections held open to measure memory.
pub const IDLE: usize = 1000;

/// A `/proc` figure in KiB: `field` of `/proc/{file}` (`VmRSS` of a
/// process's status, `Slab` of meminfo).
fn kib(file: &str, field: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{file}")).unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// Memory per idle connection: `IDLE` connections through the forwarder,
/// each after one small exchange, then held open; the daemon's RSS and
/// the machine's slab before and after, per connection (KiB).
pub fn idle_memory(ns: &NetNs, port: u16, pid: u32) -> (f64, f64) {
    limiter_tests::scenario::raise_nofile();
    let (rss0, slab0) = (kib(&format!("{pid}/status"), "VmRSS:"), kib("meminfo", "Slab:"));
    let held: Vec<TcpStream> = ns.run_in(|| {
        (0..IDLE)
            .filter_map(|_| {
                let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                s.write_all(b"c").ok()?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b).ok()?;
                Some(s)
            })
            .collect()
    });
    thread::sleep(Duration::from_millis(300));
    let (rss1, slab1) = (kib(&format!("{pid}/status"), "VmRSS:"), kib("meminfo", "Slab:"));
    let n = held.len().max(1) as f64;
    for s in &held {
        reset_on_close(s);
    }
    drop(held);
    thread::sleep(Duration::from_millis(300));
    ((rss1 - rss0) / n, (slab1 - slab0) / n)
}

/// The limiter's CPU per connection refused at its cap: a cap of 1
/// (applied as a new policy), one connection held, 16 clients.
pub fn refusal_cost(
    net: &VethPair,
    policy: &std::path::Path,
    socket: &std::path::Path,
    pid: u32,
    capped: &str,
) -> (u64, f64) {
    std::fs::write(policy, capped).unwrap();
    let apply = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["policy", "apply"])
        .arg(policy)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(apply.success());
    wait_port(&net.b, 7101);
    let held = net.b.run_in(|| {
        let mut s = TcpStream::connect(("127.0.0.1", 7101)).unwrap();
        s.write_all(b"c").unwrap();
        s
    });
    thread::sleep(Duration::from_millis(100));
    let cpu0 = cpu_secs(pid);
    let refused = net.b.run_in(|| clients(7101).1);
    let refused_us = (cpu_secs(pid) - cpu0) * 1e6 / refused.max(1) as f64;
    drop(held);
    (refused, refused_us)
}
