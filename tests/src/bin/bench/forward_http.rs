//! Bench `forward`, HTTP workloads: wrk (Debian's) through each forwarder
//! to an nginx HTTP backend that reads the PROXY header (`listen ...
//! proxy_protocol`, `return 200`), all on the loopback of one namespace,
//! rows interleaved, two rounds: new connections a second (HTTP/1.1,
//! `Connection: close`), keep-alive requests a second, the p99 latency
//! of the keep-alive run, and bytes a second on long transfers (4
//! connections fetching a 32 MiB file the backend sends with
//! `sendfile`). Two layouts of the two CPUs: the
//! forwarder sharing CPU 1 with the backend and wrk alone on CPU 0 (the
//! forwarder's own cost counts in full), and the forwarder alone on CPU 0
//! with wrk and the backend on CPU 1 (their CPU is the bound).

use std::{path::Path, time::Duration};

use limiter_tests::{
    netns::VethPair,
    scenario::{Guard, unique_socket},
};

use super::fronts;

const BACKEND: u16 = 7200;
const WRK_SECS: &str = "4";
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

/// What `wrk` runs through a forwarder.
#[derive(Clone, Copy)]
enum Load {
    /// Small requests, each on a new connection (`Connection: close`).
    Close,
    /// Small requests on 32 kept-alive connections.
    KeepAlive,
    /// The 32 MiB file, over and over on 4 connections.
    Long,
}

/// `wrk` through `port`: requests a second, the p99 in µs and bytes a
/// second.
fn wrk(net: &VethPair, cpu: &str, port: u16, load: Load) -> (f64, f64, f64) {
    let mut c = fronts::pinned(&net.b, cpu, "wrk");
    let conns = if matches!(load, Load::Long) { "-c4" } else { "-c32" };
    c.args(["-t1", conns, "-d"]).arg(format!("{WRK_SECS}s")).arg("--latency");
    if matches!(load, Load::Close) {
        c.args(["-H", "Connection: close"]);
    }
    let path = if matches!(load, Load::Long) { LONG } else { "" };
    c.arg(format!("http://127.0.0.1:{port}/{path}"));
    let out = c.output().expect("wrk (cargo xtask bench installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| text.lines().find_map(|l| l.trim().strip_prefix(name).map(str::trim));
    let rate = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
    let p99 = field("99%").map_or(f64::NAN, micros);
    let bytes = field("Transfer/sec:").map_or(f64::NAN, byte_rate);
    (rate, p99, bytes)
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

fn measure(net: &VethPair, cpu: &str, port: u16) -> Http {
    let (new_conns, _, _) = wrk(net, cpu, port, Load::Close);
    let (keepalive, p99_us, _) = wrk(net, cpu, port, Load::KeepAlive);
    let (_, _, bytes) = wrk(net, cpu, port, Load::Long);
    Http { new_conns, keepalive, p99_us, bytes }
}

/// The backend: nginx HTTP, reading the PROXY header; `/long` is a
/// 32 MiB file it sends with `sendfile`.
fn backend(net: &VethPair, dir: &Path, cpu: &str) -> Guard {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join(LONG), &*super::forward::LONG).unwrap();
    let block = format!(
        "http {{\n  access_log off;\n  keepalive_requests 10000000;\n  sendfile on;\n  server {{\n    listen 127.0.0.1:{BACKEND} proxy_protocol;\n    location / {{ return 200 \"ok\\n\"; }}\n    location = /{LONG} {{ root {}; }}\n  }}\n}}\n",
        root.display()
    );
    fronts::nginx(&net.b, dir, cpu, BACKEND, None, &block)
}

/// The three fronts, each started for its row and stopped after it: the
/// limiter in its default config.
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

/// Two rounds, rows interleaved: (limiter, haproxy, nginx), the best of
/// each forwarder's rounds per figure (the p99: the lower).
pub fn rows(net: &VethPair, dir: &Path, layout: Layout) -> [Http; 3] {
    let backend = backend(net, dir, layout.backend);
    let mut best = [Http { p99_us: f64::INFINITY, ..Http::default() }; 3];
    for round in 1..=2 {
        let fronts: [(&str, u16, Front); 3] =
            [("limiter", 7201, limiter), ("haproxy", 7202, haproxy), ("nginx", 7203, nginx)];
        for (i, (name, port, start)) in fronts.into_iter().enumerate() {
            eprintln!("bench forward: HTTP through {name} ({}), round {round}...", layout.name);
            let guard = start(net, dir, layout.front);
            let h = measure(net, layout.client, port);
            drop(guard);
            std::thread::sleep(Duration::from_millis(300));
            eprintln!(
                "bench forward: {name} round {round}: {:.0} new conns/s, {:.0} keep-alive req/s, p99 {:.0} us, {:.0} MB/s long",
                h.new_conns,
                h.keepalive,
                h.p99_us,
                h.bytes / 1e6
            );
            let b = &mut best[i];
            b.new_conns = b.new_conns.max(h.new_conns);
            b.keepalive = b.keepalive.max(h.keepalive);
            b.p99_us = b.p99_us.min(h.p99_us);
            b.bytes = b.bytes.max(h.bytes);
        }
    }
    drop(backend);
    std::thread::sleep(Duration::from_millis(300));
    best
}

/// The table and the goals: at least 1.0x both peers on new connections,
/// keep-alive requests and long transfers, and a p99 no worse than
/// haproxy's.
pub fn report(layout: Layout, rows: &[Http; 3]) {
    let names = ["limiter (PROXY v2, default config)", "haproxy 2.6 (send-proxy-v2)", "nginx 1.22 stream (PROXY v1)"];
    println!(
        "HTTP/1.1 to an nginx backend (proxy_protocol, return 200; long: a 32 MiB file by sendfile), wrk -t1 -c32 (long: -c4), {}, {WRK_SECS} s a run, best of 2 rounds",
        layout.name
    );
    println!(
        "{:<36} {:>14} {:>16} {:>12} {:>12}",
        "forwarder", "new conns/s", "keep-alive req/s", "p99 us", "long MB/s"
    );
    for (n, r) in names.iter().zip(rows) {
        println!("{n:<36} {:>14.0} {:>16.0} {:>12.0} {:>12.0}", r.new_conns, r.keepalive, r.p99_us, r.bytes / 1e6);
    }
    let [l, h, n] = rows;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    for (what, lv, hv, nv) in [
        ("new connections/s", l.new_conns, h.new_conns, n.new_conns),
        ("keep-alive requests/s", l.keepalive, h.keepalive, n.keepalive),
        ("bytes/s on long transfers", l.bytes, h.bytes, n.bytes),
    ] {
        println!(
            "goal: {what} at least haproxy's and nginx's -> {} ({:.2}x haproxy, {:.2}x nginx)",
            verdict(lv >= hv && lv >= nv),
            lv / hv,
            lv / nv
        );
    }
    println!(
        "goal: p99 of a small request no worse than haproxy's -> {} ({:.0} us against {:.0} us)",
        verdict(l.p99_us <= h.p99_us),
        l.p99_us,
        h.p99_us
    );
}
