//! The flood scenario: a real `limiter run` attached in one namespace, a
//! flooding prefix and a conforming prefix sending to it from the other.
//! Used by the integration test and by `cargo xtask demo`.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::netns::{B_ADDR, B_IF, VethPair};

mod peers;
pub use self::peers::{Pins, cli, http, metric, reason_packets, scrape, tcp_handshake};

/// How long a daemon may take to start: its verifier run alone takes
/// tens of seconds under the guest tier's emulation (Debian 13's 6.12
/// verifies 513,315 instructions of the production program; seen over
/// 20 s on these machines). On the host a start takes about a second.
pub const DAEMON_START: std::time::Duration = std::time::Duration::from_secs(90);

pub const FLOOD_SRC: &str = "198.18.1.10";
pub const CONFORM_SRC: &str = "198.18.2.10";
pub const PORT: u16 = 9000;

/// Limits and traffic of one run.
#[derive(Clone, Debug)]
pub struct Flood {
    /// Packets per second per /24.
    pub rate: u64,
    pub burst: u64,
    /// How long the flood lasts.
    pub secs: f64,
    /// Flood send rate; 0 = as fast as one core can send.
    pub flood_pps: u64,
    /// The conforming prefix's send rate (kept below `rate`).
    pub conform_pps: u64,
    /// `native` or `generic`.
    pub mode: &'static str,
}

/// What each side saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub flood_sent: u64,
    /// Flood duration as measured by its sender.
    pub flood_secs: f64,
    pub flood_received: u64,
    pub conform_sent: u64,
    pub conform_received: u64,
    /// The daemon's stdout, whole.
    pub daemon_log: String,
    /// Totals from the daemon's exit line.
    pub xdp_passed: u64,
    pub xdp_dropped: u64,
}

/// A child process stopped (and reaped) on drop: SIGTERM first, so a
/// daemon removes its control socket, SIGKILL if it is still there 2 s later.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        for _ in 0..100 {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Raise this process's open-file limit to its hard limit (a thousand
/// connections and more are held open by some tests and benches).
pub fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
    }
}

/// A control-socket path of this test process's own, so daemons started
/// by tests running in parallel never share one.
#[must_use]
pub fn unique_socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("limiter-{}-{tag}.sock", std::process::id()))
}

/// Find a workspace binary next to the running one (target/PROFILE/NAME),
/// also from target/PROFILE/deps where test harnesses live.
pub fn locate_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("{name} not found next to {} (build it first: cargo build --bins)", exe.display())
}

/// Spawn with stdout read line by line into a channel.
pub fn spawn_lines(mut cmd: Command) -> anyhow::Result<(Guard, mpsc::Receiver<String>)> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().context("spawn")?;
    let out = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((Guard(child), rx))
}

pub fn wait_for(rx: &mpsc::Receiver<String>, what: &str, timeout: Duration, log: &mut String) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    // The audit trail's line of a change repeats the change's own line:
    // it answers only a wait for an audit line.
    let audit = what.contains("audit");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                log.push_str(&l);
                log.push('\n');
                if l.contains(what) && (audit || !l.contains("limiter: audit: ")) {
                    return Ok(());
                }
            }
            Err(_) => bail!("no '{what}' within {timeout:?}; output so far:\n{log}"),
        }
    }
}

/// The `idx`-th whitespace-separated number of the first line starting with `prefix`.
#[must_use]
pub fn field(text: &str, prefix: &str, idx: usize) -> Option<u64> {
    text.lines().find(|l| l.starts_with(prefix))?.split_whitespace().nth(idx)?.parse().ok()
}

/// The number after the word `name` anywhere in `text` ("... ring_full 3").
#[must_use]
pub fn named(text: &str, name: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == name)?;
    words.next()?.parse().ok()
}

/// Traffic in flight between the namespaces of a [`VethPair`]: a receiver
/// on `b`, and on `a` a conforming sender that brackets a flood by half a
/// second on each side.
pub struct Traffic {
    recv: Guard,
    recv_rx: mpsc::Receiver<String>,
    conform: Guard,
    flood: Guard,
}

/// What the senders sent and the receiver got, per source.
#[derive(Clone, Debug, Default)]
pub struct Delivered {
    pub flood_sent: u64,
    /// Flood duration as measured by its sender.
    pub flood_secs: f64,
    pub flood_got: u64,
    /// Frames the receiver's veth took (netload's "sent": a send its full
    /// ring refused fails with ENOBUFS and is not counted).
    pub conform_sent: u64,
    pub conform_got: u64,
}

/// Start a receiver, the conforming sender (`conform_pps`) and, half a
/// second later, a flood of `secs` seconds (`flood_pps`, 0 = flat out).
pub fn start_traffic(
    net: &VethPair,
    netload: &Path,
    flood_pps: u64,
    conform_pps: u64,
    secs: f64,
) -> anyhow::Result<Traffic> {
    let margin = 0.5;
    let dst = format!("{B_ADDR}:{PORT}");
    let mut recv = net.b.command(netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), &format!("{}", secs + 6.0 * margin)]);
    let (recv, recv_rx) = spawn_lines(recv)?;
    wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new())?;
    let mut conform = net.a.command(netload);
    conform.args(["send", CONFORM_SRC, &dst, &conform_pps.to_string(), &format!("{}", secs + 2.0 * margin)]);
    let conform = Guard(conform.stdout(Stdio::piped()).spawn()?);
    thread::sleep(Duration::from_secs_f64(margin));
    let mut flood = net.a.command(netload);
    flood.args(["send", FLOOD_SRC, &dst, &flood_pps.to_string(), &format!("{secs}")]);
    let flood = Guard(flood.stdout(Stdio::piped()).spawn()?);
    Ok(Traffic { recv, recv_rx, conform, flood })
}

impl Traffic {
    /// Wait for the senders and the receiver, and collect their counts.
    pub fn finish(self) -> anyhow::Result<Delivered> {
        let Self { mut recv, recv_rx, conform, flood } = self;
        let flood_out = wait_output(flood)?;
        let conform_out = wait_output(conform)?;
        if !recv.0.wait()?.success() {
            bail!("receiver failed");
        }
        let recv_log: String = recv_rx.iter().map(|l| l + "\n").collect();
        Ok(Delivered {
            flood_sent: field(&flood_out, "sent", 1).context("flood sender output")?,
            flood_secs: flood_out.split_whitespace().nth(3).and_then(|s| s.parse().ok()).context("flood secs")?,
            flood_got: field(&recv_log, &format!("from {FLOOD_SRC}"), 2).unwrap_or(0),
            conform_sent: field(&conform_out, "sent", 1).context("conforming sender output")?,
            conform_got: field(&recv_log, &format!("from {CONFORM_SRC}"), 2).unwrap_or(0),
        })
    }
}

/// Run the scenario end to end.
pub fn run(limiter: &Path, netload: &Path, f: &Flood) -> anyhow::Result<Outcome> {
    let net = VethPair::new("fl");
    net.add_source(FLOOD_SRC);
    net.add_source(CONFORM_SRC);

    let mut daemon_cmd = net.b.command(limiter);
    daemon_cmd.args(["run", "--iface", B_IF, "--mode", f.mode, "--status-interval", "1", "--socket"]);
    daemon_cmd.arg(unique_socket(&net.b.name));
    daemon_cmd.args(["--rate", &f.rate.to_string(), "--burst", &f.burst.to_string()]);
    let (mut daemon, daemon_rx) = spawn_lines(daemon_cmd)?;
    let mut daemon_log = String::new();
    wait_for(&daemon_rx, "attached", DAEMON_START, &mut daemon_log)?;

    let traffic = start_traffic(&net, netload, f.flood_pps, f.conform_pps, f.secs)?;
    let delivered = traffic.finish()?;

    // SIGTERM: the daemon detaches and prints its totals.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(i32::try_from(daemon.0.id())?, libc::SIGTERM) };
    let st = daemon.0.wait()?;
    daemon_log.extend(daemon_rx.iter().map(|l| l + "\n"));
    if !st.success() {
        bail!("limiter exited with {st}; output:\n{daemon_log}");
    }
    let exit = daemon_log.lines().find(|l| l.contains("detached")).context("no exit line")?.to_string();
    let num_after = |word: &str| -> Option<u64> {
        let mut it = exit.split_whitespace();
        it.by_ref().find(|w| *w == word)?;
        it.next()?.parse().ok()
    };
    let Delivered { flood_sent, flood_secs, flood_got, conform_sent, conform_got } = delivered;
    Ok(Outcome {
        flood_sent,
        flood_secs,
        flood_received: flood_got,
        conform_sent,
        conform_received: conform_got,
        xdp_passed: num_after("passed").context("passed total")?,
        xdp_dropped: num_after("dropped").context("dropped total")?,
        daemon_log,
    })
}

pub fn wait_output(g: Guard) -> anyhow::Result<String> {
    let mut g = g;
    let mut out = String::new();
    if let Some(mut s) = g.0.stdout.take() {
        std::io::Read::read_to_string(&mut s, &mut out)?;
    }
    let st = g.0.wait()?;
    if !st.success() {
        bail!("sender failed: {st}");
    }
    Ok(out)
}

/// A spoofed flood of TCP segments from `net`'s sender to the receiver's
/// `port` for `secs` (`netload spoof-tcp`: `flags` in hex, or `mixed` for
/// ACKs, RSTs, FINs and data in turn; from the flood range, or from
/// `from`, an IPv4 NET/LEN): how many segments it sent.
#[must_use]
pub fn spoof_tcp(net: &VethPair, port: u16, secs: &str, flags: &str, from: Option<&str>) -> u64 {
    let (mac, dst) = (net.b_mac(), format!("{B_ADDR}:{port}"));
    let mut args = vec!["spoof-tcp", crate::netns::A_IF, &mac, &dst, secs, flags];
    args.extend(from);
    let o = net.a.command(locate_bin("netload").expect("netload")).args(&args).output().expect("run netload");
    let out = String::from_utf8_lossy(&o.stdout);
    out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("netload: {out}"))
}

/// Send `n` UDP packets from `src` (an address of `net`'s sender) to the
/// receiver within a second; how many arrived.
#[must_use]
pub fn delivered(net: &VethPair, src: &str, n: u64) -> u64 {
    let netload = locate_bin("netload").expect("netload");
    let mut recv = net.b.command(&netload);
    // Until all `n` arrived, or 2 s from the first (2 s from ready if
    // none does): the sender spreads them over 1 s, and may start late on
    // a loaded machine (a CI run lost the last of 50 to a window fixed
    // from ready).
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), "2", &n.to_string()]);
    let (mut recv, rx) = spawn_lines(recv).expect("start netload recv");
    wait_for(&rx, "ready", Duration::from_secs(10), &mut String::new()).expect("netload recv ready");
    let send = net
        .a
        .command(&netload)
        .args(["send", src, &format!("{B_ADDR}:{PORT}"), &n.to_string(), "1"])
        .stdout(Stdio::null())
        .status()
        .expect("netload send");
    assert!(send.success());
    assert!(recv.0.wait().expect("netload recv").success());
    let log: String = rx.iter().map(|l| l + "\n").collect();
    field(&log, &format!("from {src}"), 2).unwrap_or(0)
}

/// What [`two_cpus`] saw: one /24 flooded from both CPUs, and a
/// conforming /24 sending from both CPUs too.
#[derive(Clone, Debug, Default)]
pub struct TwoCpus {
    pub flood_sent: u64,
    /// The longer of the two flood senders' durations.
    pub flood_secs: f64,
    pub flood_got: u64,
    /// Frames the receiver's veth ring took: a send the ring had no room
    /// for fails (ENOBUFS) and is counted in `ring_dropped` instead, as
    /// no XDP program ever saw it.
    pub conform_sent: u64,
    pub conform_got: u64,
    /// Sends of both senders that the full veth ring dropped.
    pub ring_dropped: u64,
}

/// One /24 flooded from both CPUs at once for `secs` (two senders pinned
/// with taskset, 198.18.1.10 on CPU 0 and .11 on CPU 1, a two-queue veth,
/// so XDP charges the bucket on both CPUs), while a conforming /24 sends
/// `conform_pps` split the same way (198.18.2.10 and .11), through the
/// real `limiter run` at `rate`/`burst`.
pub fn two_cpus(
    limiter: &Path,
    netload: &Path,
    rate: u64,
    burst: u64,
    secs: f64,
    conform_pps: u64,
) -> anyhow::Result<TwoCpus> {
    const FLOOD: [&str; 2] = ["198.18.1.10", "198.18.1.11"];
    const CONFORM: [&str; 2] = ["198.18.2.10", "198.18.2.11"];
    let net = VethPair::new("2c");
    for a in FLOOD.iter().chain(&CONFORM) {
        net.add_source(a);
    }
    let mut c = net.b.command(limiter);
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off"]);
    c.args(["--rate", &rate.to_string(), "--burst", &burst.to_string(), "--socket"]);
    c.arg(unique_socket("2c"));
    let (_daemon, rx) = spawn_lines(c)?;
    wait_for(&rx, "control socket", DAEMON_START, &mut String::new())?;
    let dst = format!("{B_ADDR}:{PORT}");
    let mut recv = net.b.command(netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), &format!("{}", secs + 3.0)]);
    let (mut recv, recv_rx) = spawn_lines(recv)?;
    wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new())?;
    let send = |cpu: usize, src: &str, pps: u64, secs: f64| -> anyhow::Result<Guard> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &net.a.name, "taskset", "-c", &cpu.to_string()]).arg(netload);
        c.args(["send", src, &dst, &pps.to_string(), &format!("{secs}")]);
        Ok(Guard(c.stdout(Stdio::piped()).spawn()?))
    };
    let conform =
        [send(0, CONFORM[0], conform_pps / 2, secs + 1.0)?, send(1, CONFORM[1], conform_pps / 2, secs + 1.0)?];
    thread::sleep(Duration::from_millis(500));
    let flood = [send(0, FLOOD[0], 0, secs)?, send(1, FLOOD[1], 0, secs)?];
    let flood_out = flood.map(wait_output);
    let conform_out = conform.map(wait_output);
    if !recv.0.wait()?.success() {
        bail!("receiver failed");
    }
    let log: String = recv_rx.iter().map(|l| l + "\n").collect();
    let got = |srcs: [&str; 2]| srcs.iter().map(|s| field(&log, &format!("from {s}"), 2).unwrap_or(0)).sum();
    let mut out = TwoCpus { flood_got: got(FLOOD), conform_got: got(CONFORM), ..TwoCpus::default() };
    for o in flood_out {
        let o = o?;
        out.flood_sent += field(&o, "sent", 1).context("flood sender output")?;
        out.ring_dropped += named(&o, "ring_full").unwrap_or(0);
        let s: f64 = o.split_whitespace().nth(3).and_then(|s| s.parse().ok()).context("flood secs")?;
        out.flood_secs = out.flood_secs.max(s);
    }
    for o in conform_out {
        let o = o?;
        out.conform_sent += field(&o, "sent", 1).context("conforming sender output")?;
        out.ring_dropped += named(&o, "ring_full").unwrap_or(0);
    }
    Ok(out)
}
