//! Bench `forward`, HTTP workloads: wrk (Debian's) through each forwarder
//! to an nginx HTTP backend that reads the PROXY header (`listen ...
//! proxy_protocol`, `return 200`), all on the loopback of one namespace,
//! rows interleaved (`rounds`): new connections a second (HTTP/1.1,
//! `Connection: close`), keep-alive requests a second, the p99 latency
//! of the keep-alive run, and bytes a second on long transfers (4
//! connections fetching a 32 MiB file the backend sends with
//! `sendfile`). Two layouts of the two CPUs: the
//! forwarder sharing CPU 1 with the backend and wrk alone on CPU 0 (the
//! forwarder's own cost counts in full), and the forwarder alone on CPU 0
//! with wrk and the backend on CPU 1 (their CPU is the bound: the table
//! shows each CPU's busy share during the keep-alive run).

use std::{path::Path, time::Duration};

use limiter_tests::{
    netns::VethPair,
    scenario::{Guard, unique_socket},
};

use crate::{
    fronts,
    rounds::{Fig, ROUNDS, busy_during, median_of, order, verdict},
};

const BACKEND: u16 = 7200;
const WRK_SECS: u32 = 2;
/// The long transfer's file, in the backend's root: the own shape's
/// 32 MiB (`forward::LONG`).
const LONG: &str = "long";

/// One workload's figures for one forwarder.
#[derive(Clone, Copy, Default)]
pub struct Http {
    pub new_conns: f64,
    pub keepalive: f64,
    /// p99 of the keep-alive run, in µs.
    pub p99_us: f64,
    /// Bytes a second on long transfers.
    pub bytes: f64,
    /// CPU 0 and CPU 1 busy during each run, by `Load`.
    pub busy: [[f64; 2]; 3],
}

/// Which CPU runs what.
#[derive(Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    client: &'static str,
    front: &'static str,
    backend: &'static str,
}

pub const LAYOUTS: [Layout; 2] = [
    Layout { name: "wrk on CPU 0, each forwarder and the backend on CPU 1", client: "0", front: "1", backend: "1" },
    Layout { name: "each forwarder on CPU 0, wrk and the backend on CPU 1", client: "1", front: "0", backend: "1" },
];

/// What `wrk` runs through a forwarder (in this order in `Http::busy`).
#[derive(Clone, Copy)]
enum Load {
    /// Small requests, each on a new connection (`Connection: close`).
    Close,
    /// Small requests on 32 kept-alive connections.
    KeepAlive,
    /// The 32 MiB file, over and over on 4 connections.
    Long,
}

/// `wrk` through `port`: requests a second, the p99 in µs, bytes a
/// second, and each CPU's busy share meanwhile.
fn wrk(net: &VethPair, cpu: &str, port: u16, load: Load) -> (f64, f64, f64, [f64; 2]) {
    let mut c = fronts::pinned(&net.b, cpu, "wrk");
    let conns = if matches!(load, Load::Long) { "-c4" } else { "-c32" };
    c.args(["-t1", conns, "-d"]).arg(format!("{WRK_SECS}s")).arg("--latency");
    if matches!(load, Load::Close) {
        c.args(["-H", "Connection: close"]);
    }
    let path = if matches!(load, Load::Long) { LONG } else { "" };
    c.arg(format!("http://127.0.0.1:{port}/{path}"));
    let (out, busy) = busy_during(|| c.output().expect("wrk (cargo xtask bench installs it)"));
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| text.lines().find_map(|l| l.trim().strip_prefix(name).map(str::trim));
    let rate = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    let p99 = field("99%").map_or(f64::NAN, micros);
    let bytes = field("Transfer/sec:").map_or(f64::NAN, byte_rate);
    (rate, p99, bytes, busy)
}

/// wrk's `1.42GB`, `980.12MB`, `12.3KB` or `512.00B` (binary units), in bytes.
fn byte_rate(v: &str) -> f64 {
    let scale = [("GB", 1u64 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1)];
    scale
        .iter()
        .find_map(|(unit, s)| v.strip_suffix(unit).and_then(|n| n.parse::<f64>().ok()).map(|n| n * *s as f64))
        .unwrap_or(f64::NAN)
}

/// wrk's `1.23ms`, `456.78us` or `1.20s`, in µs.
fn micros(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e6)
    } else {
        (v, f64::NAN)
    };
    num.parse::<f64>().map_or(f64::NAN, |n| n * scale)
}

/// The backend: nginx HTTP, reading the PROXY header; `/long` is a
/// 32 MiB file it sends with `sendfile`.
fn backend(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join(LONG), &*super::LONG).unwrap();
    let block = format!(
        "http {{\n  access_log off;\n  keepalive_requests 10000000;\n  sendfile on;\n  server {{\n    listen 127.0.0.1:{BACKEND} proxy_protocol;\n    location / {{ return 200 \"ok\\n\"; }}\n    location = /{LONG} {{ root {}; }}\n  }}\n}}\n",
        root.display()
    );
    fronts::nginx(&net.b, dir, cpu, BACKEND, None, &block)
}

/// The limiter in its default config.
fn limiter(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    let policy = dir.join("http.toml");
    std::fs::write(&policy, fronts::limiter_policy(7201, BACKEND, 20_000, "")).unwrap();
    fronts::limiter(&net.b, cpu, &policy, &unique_socket("bfwh"))
}

fn haproxy(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    fronts::haproxy(&net.b, dir, cpu, 7202, BACKEND)
}

fn nginx(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    fronts::nginx_stream(&net.b, dir, cpu, 7203, BACKEND)
}

/// Starts a front on a CPU.
type Front = fn(&VethPair, &Path, &str) -> Guard;

/// `ROUNDS` rounds, rows interleaved: each round's (limiter, haproxy,
/// nginx). The three are started once, each warmed up by a run of
/// keep-alive requests (a front's first run after its start was up to 15%
/// slower), and each idles while the others' rows run.
pub fn rows(net: &VethPair, dir: &Path, layout: Layout) -> Vec<[Http; 3]> {
    let backend = backend(net, dir, layout.backend);
    let fronts: [(&str, u16, Front); 3] =
        [("limiter", 7201, limiter), ("haproxy", 7202, haproxy), ("nginx", 7203, nginx)];
    let running: Vec<Guard> = fronts
        .iter()
        .map(|&(_, port, start)| {
            let guard = start(net, dir, layout.front);
            let _ = wrk(net, layout.client, port, Load::KeepAlive);
            guard
        })
        .collect();
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        eprintln!("bench forward: HTTP ({}), round {}...", layout.name, round + 1);
        // A workload at a time, so each workload's rows are seconds apart.
        let mut this = [Http::default(); 3];
        for load in [Load::Close, Load::KeepAlive, Load::Long] {
            for i in order(3, round) {
                let (rate, p99, bytes, busy) = wrk(net, layout.client, fronts[i].1, load);
                let h = &mut this[i];
                match load {
                    Load::Close => h.new_conns = rate,
                    Load::KeepAlive => (h.keepalive, h.p99_us) = (rate, p99),
                    Load::Long => h.bytes = bytes,
                }
                h.busy[load as usize] = busy;
            }
        }
        for (i, h) in this.iter().enumerate() {
            eprintln!(
                "bench forward: {} round {}: {:.0} new conns/s, {:.0} keep-alive req/s, p99 {:.0} us, {:.0} MB/s long",
                fronts[i].0,
                round + 1,
                h.new_conns,
                h.keepalive,
                h.p99_us,
                h.bytes / 1e6
            );
        }
        rounds.push(this);
    }
    drop(running);
    drop(backend);
    std::thread::sleep(Duration::from_millis(300));
    rounds
}

/// The table (each figure the median of a forwarder's rounds) and the
/// goals, each on the median of the rounds' ratios: at least 1.0x both
/// peers on new connections, keep-alive requests and long transfers, and
/// a p99 no worse than haproxy's.
pub fn report(layout: Layout, rounds: &[[Http; 3]]) {
    let names = ["limiter (PROXY v2, default config)", "haproxy 2.6 (send-proxy-v2)", "nginx 1.22 stream (PROXY v1)"];
    println!(
        "HTTP/1.1 to an nginx backend (proxy_protocol, return 200; long: a 32 MiB file by sendfile), wrk -t1 -c32 (long: -c4), {}, {WRK_SECS} s a run, median of {ROUNDS} interleaved rounds",
        layout.name
    );
    println!(
        "{:<36} {:>14} {:>16} {:>12} {:>12} {:>22}",
        "forwarder", "new conns/s", "keep-alive req/s", "p99 us", "long MB/s", "busy CPU 0/1 (k-a)"
    );
    let front: usize = layout.front.parse().unwrap();
    let other = 1 - front;
    // Each forwarder's median busy share of `cpu` in run `load`.
    let busy = |i: usize, load: Load, cpu: usize| median_of(rounds, |r| r[i].busy[load as usize][cpu]);
    for (i, n) in names.iter().enumerate() {
        let m = |f: Fig<Http>| median_of(rounds, |r| f(&r[i]));
        let kept = format!("{:.0}%/{:.0}%", busy(i, Load::KeepAlive, 0) * 100.0, busy(i, Load::KeepAlive, 1) * 100.0);
        println!(
            "{n:<36} {:>14.0} {:>16.0} {:>12.0} {:>12.0} {kept:>22}",
            m(|h| h.new_conns),
            m(|h| h.keepalive),
            m(|h| h.p99_us),
            m(|h| h.bytes) / 1e6
        );
    }
    // The median over the rounds of the limiter's figure against peer `p`'s.
    let ratio = |p: usize, f: Fig<Http>| median_of(rounds, |r| f(&r[0]) / f(&r[p]));
    // The goal's verdict, given the run's busy shares (`rounds::verdict`).
    let judge = |ok: bool, load: Load| {
        let on = |cpu: usize| [0, 1, 2].map(|i| busy(i, load, cpu));
        verdict(ok, &on(front), &on(other), other)
    };
    let figures: [(&str, Fig<Http>, Load); 3] = [
        ("new connections/s", |h| h.new_conns, Load::Close),
        ("keep-alive requests/s", |h| h.keepalive, Load::KeepAlive),
        ("bytes/s on long transfers", |h| h.bytes, Load::Long),
    ];
    for (what, f, load) in figures {
        let (h, n) = (ratio(1, f), ratio(2, f));
        println!(
            "goal: {what} at least haproxy's and nginx's -> {} ({h:.2}x haproxy, {n:.2}x nginx, medians of the rounds' ratios)",
            judge(h >= 1.0 && n >= 1.0, load),
        );
    }
    let p99 = ratio(1, |h| h.p99_us);
    println!(
        "goal: p99 of a small request no worse than haproxy's -> {} ({p99:.2}x haproxy's, median of the rounds' ratios)",
        judge(p99 <= 1.0, Load::KeepAlive),
    );
}
