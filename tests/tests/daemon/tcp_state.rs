//! Out-of-state TCP over a veth pair: a real TCP server in the DUT
//! namespace behind `limiter run`, a long connection from a real client
//! (a kernel socket sending a steady 1 MB/s), and spoofed floods of bare
//! ACKs, RSTs, FINs and data segments from 500 /24s (each under its
//! allowance) at the generator's full rate. Without the check the DUT's
//! kernel answers every segment with a RST; with it (the default, `auto`)
//! it engages, the kernel sends almost none, the long connection keeps
//! its pace, new clients connect, a flood from the client's own /24
//! costs it nothing, and `kill -9` and a restart under the flood leave
//! the connection alive.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter::dataplane::AttachMode;
use limiter_common::programs;
use limiter_tests::{
    kernel::require_root,
    netns::{A_IF, B_ADDR, B_IF, VethPair},
    scenario::{self, CONFORM_SRC, Guard, spawn_lines, wait_for},
};
use socket2::{Domain, Socket, Type};

const PORT: u16 = 8080;
/// The long connection's pace: 10 KB every 10 ms.
const CHUNK: usize = 10_000;
const PACE: Duration = Duration::from_millis(10);
const NEW_CLIENTS: usize = 20;

/// Removes the test's pins even when the test fails.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = limiter::dataplane::pin::unload(&self.0, false);
    }
}

fn start_daemon(net: &VethPair, pins: &Path, policy: &Path, socket: &Path) -> (Guard, std::sync::mpsc::Receiver<String>) {
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--pin", "--status-interval", "0", "--metrics", "off", "--policy"])
        .arg(policy)
        .arg("--socket")
        .arg(socket)
        .arg("--pin-dir")
        .arg(pins);
    let (g, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "pinned in", scenario::DAEMON_START, &mut log).unwrap();
    (g, rx)
}

/// A spoofed flood of mixed segments for `secs` from the flood range (or
/// `from`): how many it sent.
fn flood(net: &VethPair, secs: &str, from: Option<&str>) -> u64 {
    scenario::spoof_tcp(net, PORT, secs, "mixed", from)
}

/// Bytes the server received over `d` from now.
fn received_over(total: &AtomicU64, d: Duration) -> u64 {
    let before = total.load(Ordering::Relaxed);
    thread::sleep(d);
    total.load(Ordering::Relaxed) - before
}

/// Connect from `src`, read the server's greeting.
fn connect_once(src: &str, dst: SocketAddr) -> anyhow::Result<Duration> {
    use anyhow::Context as _;
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(src.parse()?, 0).into()).with_context(|| format!("bind {src}"))?;
    let start = Instant::now();
    s.connect_timeout(&dst.into(), Duration::from_secs(5)).with_context(|| format!("connect from {src}"))?;
    let took = start.elapsed();
    let mut c: TcpStream = s.into();
    c.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut hello = [0u8; 3];
    c.read_exact(&mut hello).with_context(|| format!("greeting to {src}"))?;
    Ok(took)
}

/// The pair, the new clients' addresses, no IPv6 on the link (its
/// neighbour discovery would get a bucket), and the generator's program,
/// which drops the RSTs its spoofed sources draw, as an attacker's
/// network would.
fn setup(new_clients: &[String]) -> (VethPair, limiter::dataplane::DataPlane) {
    let net = VethPair::new("tst");
    net.add_source(CONFORM_SRC);
    for c in new_clients {
        net.add_source(c);
    }
    for (ns, dev) in [(&net.a, A_IF), (&net.b, B_IF)] {
        let off = ns.command("sysctl").args(["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]).status();
        assert!(off.unwrap().success());
    }
    let mut generator = limiter::dataplane::DataPlane::open_bench(1024).unwrap();
    net.a.run_in(|| {
        generator.attach_entry(programs::BENCH_DROP_FLOOD_REPLIES, A_IF, AttachMode::Native).unwrap();
    });
    (net, generator)
}

/// The service: greets every connection and counts what it reads into
/// `total`, until `stop`.
fn serve(listener: TcpListener, total: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((mut c, _)) = listener.accept() else {
                thread::sleep(Duration::from_millis(1));
                continue;
            };
            let total = total.clone();
            thread::spawn(move || {
                let _ = c.set_nonblocking(false);
                let _ = c.write_all(b"hi\n");
                let mut buf = vec![0u8; 65_536];
                while let Ok(n @ 1..) = c.read(&mut buf) {
                    total.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    })
}

/// The long connection from [`CONFORM_SRC`]: [`CHUNK`] bytes every
/// [`PACE`] until `stop`; what it sent, or how it failed.
fn long_connection(net: &VethPair, dst: SocketAddr, stop: Arc<AtomicBool>) -> thread::JoinHandle<anyhow::Result<u64>> {
    net.a.spawn_in(move || -> anyhow::Result<u64> {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.bind(&SocketAddr::new(CONFORM_SRC.parse()?, 0).into())?;
        s.connect_timeout(&dst.into(), Duration::from_secs(5))?;
        let mut c: TcpStream = s.into();
        let mut hello = [0u8; 3];
        c.read_exact(&mut hello)?;
        let (chunk, mut sent, start) = (vec![0x5a; CHUNK], 0u64, Instant::now());
        for tick in 1u32.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            c.write_all(&chunk)?;
            sent += CHUNK as u64;
            let due = start + PACE * tick;
            thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        Ok(sent)
    })
}

#[test]
fn an_out_of_state_flood_never_reaches_the_stack_and_connections_keep_their_pace() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let new_clients: Vec<String> = (1..=NEW_CLIENTS).map(|i| format!("198.18.3.{i}")).collect();
    let (net, _generator) = setup(&new_clients);
    let dir = std::env::temp_dir().join(format!("limiter-tcp-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pins = Pins(PathBuf::from(format!("/sys/fs/bpf/limiter-test-tst-{}", std::process::id())));
    let socket = scenario::unique_socket("tcp-state");
    let (off, auto) = (dir.join("off.toml"), dir.join("auto.toml"));
    std::fs::write(&off, "tcp_state = \"off\"\n").unwrap();
    std::fs::write(&auto, "# the built-in policy: tcp_state = \"auto\"\nallow_empty = true\n").unwrap();

    // The service, then its long connection: it greets every connection
    // and counts what it reads.
    let dst: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let listener = net.b.run_in(|| TcpListener::bind(dst).unwrap());
    let total = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let server = serve(listener, total.clone(), stop.clone());
    let (mut daemon, _rx) = start_daemon(&net, &pins.0, &off, &socket);
    let writer = long_connection(&net, dst, stop.clone());
    let _stopper = StopOnDrop(&stop);

    // Its pace without a flood.
    thread::sleep(Duration::from_secs(1));
    let quiet = received_over(&total, Duration::from_secs(2));

    // Before: the check off, the kernel answers each segment.
    let r0 = net.b.nstat("TcpOutRsts");
    let sent_off = flood(&net, "2", None);
    let rst_off = net.b.nstat("TcpOutRsts") - r0;
    println!("check off: {sent_off} segments sent, the DUT's kernel sent {rst_off} RSTs");
    assert!(rst_off as f64 > 0.5 * sent_off as f64, "without the check the kernel answers the flood: {rst_off}");

    // The built-in policy (`auto`): a restart re-adopts the pins.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(daemon.0.id()).unwrap(), libc::SIGTERM) };
    let _ = daemon.0.wait();
    let (mut daemon, rx) = start_daemon(&net, &pins.0, &auto, &socket);
    // A first flood engages the check, said in the log.
    thread::scope(|s| {
        let f = s.spawn(|| flood(&net, "2", None));
        let mut log = String::new();
        let engaged = wait_for(&rx, "out-of-state TCP check engaged for class default", Duration::from_secs(10), &mut log);
        f.join().unwrap();
        engaged.unwrap_or_else(|e| panic!("{e:#}: {log}"));
    });
    let status = scenario_cli(&socket, &["status"]);
    assert!(status.contains("judging out-of-state TCP in class default"), "{status}");
    // `limiter explain` says the class's check, engaged, for a TCP segment.
    let explained = scenario_cli(&socket, &["explain", CONFORM_SRC, "--protocol", "tcp", "--port", "8080", "-j"]);
    let e: serde_json::Value = serde_json::from_str(&explained).unwrap();
    let layer = e["layers"].as_array().unwrap().iter().find(|l| l["layer"] == "tcp_state").expect("a tcp_state layer");
    assert_eq!((&layer["detail"]["mode"], &layer["detail"]["engaged"]), (&"auto".into(), &true.into()), "{e}");

    // The flood again, now engaged: the connection's pace, new clients,
    // the kernel's RSTs.
    let r1 = net.b.nstat("TcpOutRsts");
    let (sent_on, (during, connects)) = thread::scope(|s| {
        let f = s.spawn(|| flood(&net, "4", None));
        thread::sleep(Duration::from_millis(500));
        let during = received_over(&total, Duration::from_secs(2));
        let connects: Vec<anyhow::Result<Duration>> =
            net.a.run_in(|| new_clients.iter().map(|c| connect_once(c, dst)).collect());
        (f.join().unwrap(), (during, connects))
    });
    let rst_on = net.b.nstat("TcpOutRsts") - r1;
    let failed: Vec<String> = connects.iter().filter_map(|r| r.as_ref().err()).map(|e| format!("{e:#}")).collect();
    let counted = scenario_cli(&socket, &["stats"]);
    println!(
        "check engaged: {sent_on} segments sent, {rst_on} RSTs; the long connection {during} B in 2 s during the \
         flood, {quiet} B in 2 s without; {} of {NEW_CLIENTS} new clients connected\n{stats}",
        NEW_CLIENTS - failed.len(),
        stats = counted
    );
    assert!(failed.is_empty(), "new clients failed: {failed:?}");
    assert!((rst_on as f64) <= 0.01 * sent_on as f64, "{rst_on} RSTs for {sent_on} segments");
    assert!(during as f64 >= 0.95 * quiet as f64, "the long connection's pace: {during} B vs {quiet} B");
    let dropped = scenario::reason_packets(&socket, "tcp_out_of_state");
    assert!(dropped > sent_on / 2, "limiter stats: {counted}");

    // The same flood from the client's own /24: it costs the client
    // nothing (each segment's charge is given back).
    let (from_own, own) = thread::scope(|s| {
        let f = s.spawn(|| flood(&net, "3", Some("198.18.2.0/24")));
        thread::sleep(Duration::from_millis(500));
        let own = received_over(&total, Duration::from_secs(2));
        (f.join().unwrap(), own)
    });
    println!("a flood of {from_own} segments from the client's own /24: the long connection {own} B in 2 s");
    assert!(own as f64 >= 0.95 * quiet as f64, "the long connection's pace: {own} B vs {quiet} B");

    // kill -9 and a restart under the flood: the connection lives on.
    let survived = thread::scope(|s| {
        let f = s.spawn(|| flood(&net, "6", None));
        thread::sleep(Duration::from_secs(1));
        daemon.0.kill().unwrap();
        let _ = daemon.0.wait();
        thread::sleep(Duration::from_secs(1));
        let (d, _rx) = start_daemon(&net, &pins.0, &auto, &socket);
        let after = received_over(&total, Duration::from_secs(2));
        f.join().unwrap();
        (d, after)
    });
    let (_daemon, after) = survived;
    println!("after kill -9 and a restart under the flood: {after} B in 2 s");
    assert!(after as f64 >= 0.95 * quiet as f64, "the long connection's pace after the restart: {after} B");
    stop.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap().expect("the long connection never failed");
    assert!(sent > 0);
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What `limiter ARGS...` printed, asked of the daemon at `socket`.
fn scenario_cli(socket: &Path, args: &[&str]) -> String {
    String::from_utf8_lossy(&scenario::cli(socket, args).stdout).into_owned()
}
