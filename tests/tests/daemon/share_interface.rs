//! Sharing the interface (`--attach`): with Debian's xdp-tools as the
//! neighbour. What this machine's kernel allows decides what is shown: on
//! these CI machines it refuses `freplace` programs (libxdp's own
//! dispatcher check fails with EPERM and xdp-loader falls back to one
//! program alone), so the dispatcher itself cannot run here; the refusals
//! and the exclusive path are what an operator meets here, and are
//! checked against the interface's real state.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use limiter_common::programs;
use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, spawn_lines, unique_socket, wait_for},
    sharing::{FILTERED_SRC, LibxdpDir, XdpFilter, listed_id, loader_status},
};

fn bin() -> PathBuf {
    scenario::locate_bin("limiter").unwrap()
}

/// `limiter run --attach ATTACH` on the receiver's interface, which must
/// refuse: its output. A start instead (it would run until killed) is
/// ended after 30 s and fails the test.
fn run(net: &VethPair, attach: &str, tag: &str) -> std::process::Output {
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--attach", attach, "--metrics", "off", "--status-interval", "0", "--socket"])
        .arg(unique_socket(tag))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("--attach {attach} started instead of refusing: {}", String::from_utf8_lossy(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// A program attached without a dispatcher (here one of the bench
/// object's, attached as `ip link set ... xdp` would) is refused by
/// `auto` and `libxdp` with its name, its id and what to do, and stays
/// where it is. (On a kernel with `freplace`, xdp-loader would have put
/// xdp-filter under a dispatcher, which the limiter joins instead.)
#[test]
fn a_program_without_a_dispatcher_is_named_and_left_in_place() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let _libxdp = LibxdpDir::hold();
    let net = VethPair::new("shfo");
    let mut other = limiter::dataplane::DataPlane::open_bench(1024).unwrap();
    net.b.run_in(|| {
        other.attach_entry(programs::BENCH_PASS, B_IF, limiter::dataplane::AttachMode::Native).unwrap();
    });
    let before = loader_status(&net);
    let id =
        listed_id(&before, programs::BENCH_PASS).unwrap_or_else(|| panic!("xdp-loader lists no program:\n{before}"));
    for attach in ["auto", "libxdp"] {
        let o = run(&net, attach, &format!("shfo-{attach}"));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "--attach {attach}: {err}");
        assert!(
            err.contains(&format!("XDP program {} (id {id}) attached without a dispatcher", programs::BENCH_PASS)),
            "--attach {attach}: {err}"
        );
        assert!(err.contains("xdp-loader load vb") && err.contains("--attach exclusive"), "{err}");
        println!("--attach {attach}: {}", err.trim());
    }
    assert_eq!(listed_id(&loader_status(&net), programs::BENCH_PASS), Some(id), "the neighbour was touched");
}

/// xdp-filter loaded by Debian's xdp-loader: where the kernel takes
/// `freplace` programs it sits under libxdp's dispatcher and `auto` joins
/// it (both listed under one dispatcher, the limiter at its priority 10,
/// both chained on XDP_PASS); where it does not (these development
/// machines), xdp-loader attached it alone and `auto` and `libxdp` refuse
/// with its name, id and what to do, leaving it in place.
#[test]
fn auto_joins_xdp_filters_dispatcher_or_names_it_where_there_is_none() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let _libxdp = LibxdpDir::hold();
    let net = VethPair::new("shxf");
    for src in [scenario::FLOOD_SRC, scenario::CONFORM_SRC, FILTERED_SRC] {
        net.add_source(src);
    }
    let _filter = XdpFilter::load(&net);
    let before = loader_status(&net);
    let id = listed_id(&before, "xdpfilt_alw_all").unwrap_or_else(|| panic!("xdp-loader lists no program:\n{before}"));
    if !before.contains("xdp_dispatcher") {
        for attach in ["auto", "libxdp"] {
            let o = run(&net, attach, &format!("shxf-{attach}"));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "--attach {attach}: {err}");
            assert!(
                err.contains(&format!("XDP program xdpfilt_alw_all (id {id}) attached without a dispatcher")),
                "--attach {attach}: {err}"
            );
            println!("--attach {attach} (no freplace): {}", err.trim());
        }
        assert_eq!(listed_id(&loader_status(&net), "xdpfilt_alw_all"), Some(id), "the neighbour was touched");
        return;
    }
    // At priority 20: after xdp-filter's 10.
    let socket = unique_socket("shxf");
    let tmp = TempDir::new("shxf");
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, "rate = 100\nburst = 100\ntcp_state = \"always\"\n").unwrap();
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--attach", "auto", "--priority", "20", "--metrics", "off"])
        .args(["--status-interval", "0", "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut daemon = Guard(c.spawn().unwrap());
    let start = Instant::now();
    let status = loop {
        let status = loader_status(&net);
        if status.contains("limiter_chain") {
            break status;
        }
        if let Some(code) = daemon.0.try_wait().unwrap() {
            // A kernel that refuses a component changing packet data in
            // a slot that does not (6.12 with this build's libxdp): said
            // in one line, xdp-filter left as it was.
            let mut err = String::new();
            daemon.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(err.contains("refuses a dispatcher component that changes packet data"), "{code}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert_eq!(listed_id(&loader_status(&net), "xdpfilt_alw_all"), Some(id), "the neighbour was touched");
            println!("--attach auto on this kernel: {}", err.trim());
            return;
        }
        assert!(start.elapsed() < Duration::from_mins(1), "neither joined nor refused in 60 s:\n{status}");
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("{status}");
    let mine = status.lines().find(|l| l.contains("limiter_chain")).unwrap_or_else(|| panic!("not joined:\n{status}"));
    assert!(mine.contains(" 20 ") && mine.contains("XDP_PASS"), "{status}");
    // xdp-filter stays, chained on XDP_PASS, under the one dispatcher,
    // and runs first.
    let theirs = status.lines().find(|l| l.contains("xdpfilt_alw_all")).unwrap_or_else(|| panic!("{status}"));
    assert!(theirs.contains("XDP_PASS") && theirs.contains(&id.to_string()), "{status}");
    assert_eq!(status.matches("xdp_dispatcher").count(), 1, "{status}");
    assert!(status.find("xdpfilt_alw_all") < status.find("limiter_chain"), "{status}");
    // `limiter status` names the neighbour: name, id, priority.
    let ours = Command::new(bin()).args(["status", "--socket"]).arg(&socket).output().unwrap();
    let ours = String::from_utf8_lossy(&ours.stdout).into_owned();
    println!("{ours}");
    let line = ours.lines().find(|l| l.starts_with("dispatcher")).unwrap_or_else(|| panic!("{ours}"));
    assert!(
        line.contains("at priority 20") && line.contains(&format!("xdpfilt_alw_all (id {id}, priority 10)")),
        "{ours}"
    );
    // Both enforce, one after the other: a flood of
    // 1,000 from one /24 is held to its allowance (burst 100 and 100/s),
    // a conforming /24 loses nothing, and what xdp-filter lists is
    // dropped by xdp-filter.
    let deny = net.b.net_command("xdp-filter").args(["ip", "--mode", "src", FILTERED_SRC]).output().unwrap();
    assert!(deny.status.success(), "xdp-filter ip: {}", String::from_utf8_lossy(&deny.stderr));
    let flood = scenario::delivered(&net, scenario::FLOOD_SRC, 1000);
    let conform = scenario::delivered(&net, scenario::CONFORM_SRC, 50);
    let filtered = scenario::delivered(&net, FILTERED_SRC, 50);
    println!(
        "behind xdp-filter: a flood of 1000 delivered {flood}, a conforming source {conform}/50, xdp-filter's denied source {filtered}/50"
    );
    assert!((100..=400).contains(&flood), "the flood was not held to its allowance: {flood}");
    assert_eq!(conform, 50);
    assert_eq!(filtered, 0, "xdp-filter's deny does not hold behind the limiter");
    out_of_state_behind_the_dispatcher(&net, &socket);
    // `--attach exclusive` next to the dispatcher is refused, naming its
    // programs.
    let o = run(&net, "exclusive", "shxf-ex");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("libxdp's dispatcher")
            && err.contains(&format!("xdpfilt_alw_all (id {id}, priority 10)"))
            && err.contains("limiter_chain")
            && err.contains("--attach auto"),
        "{err}"
    );
    println!("--attach exclusive next to the dispatcher: {}", err.trim());
    assert_eq!(loader_status(&net).matches("limiter_chain").count(), 1, "the refused start touched the chain");
    drop(daemon);
}

/// The out-of-state check as a dispatcher component (the policy's
/// `tcp_state = "always"`): a real connection carries data in both
/// directions, and spoofed bare ACKs to its listener are dropped by the
/// limiter instead of answered by the kernel.
fn out_of_state_behind_the_dispatcher(net: &VethPair, socket: &std::path::Path) {
    let (listener, client) = scenario::tcp_handshake(net, scenario::CONFORM_SRC, 8080);
    let mut server = net.b.run_in(|| listener.accept()).unwrap().0;
    let mut client: TcpStream = client.into();
    let exchange = |client: &mut TcpStream, server: &mut TcpStream| {
        let mut got = [0u8; 4];
        client.write_all(b"ping").unwrap();
        server.read_exact(&mut got).unwrap();
        server.write_all(b"pong").unwrap();
        client.read_exact(&mut got).unwrap();
        got == *b"pong"
    };
    for s in [&client, &server] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    assert!(exchange(&mut client, &mut server), "the connection behind the dispatcher");
    let rsts = net.b.nstat("TcpOutRsts");
    let sent = scenario::spoof_tcp(net, 8080, "1", "10", None);
    let rsts = net.b.nstat("TcpOutRsts") - rsts;
    let judged = scenario::reason_packets(socket, "tcp_out_of_state");
    println!("behind xdp-filter: {sent} spoofed ACKs, {judged} dropped as out of state, the kernel sent {rsts} RSTs");
    assert!(judged > 0, "no segment judged out of state behind the dispatcher");
    assert!(rsts * 100 <= sent, "{rsts} RSTs for {sent} spoofed ACKs");
    assert!(exchange(&mut client, &mut server), "the connection after the flood");
}

/// `auto` on a bare interface attaches alone, as `exclusive` does;
/// `libxdp` builds a dispatcher, or, where the kernel refuses `freplace`,
/// says so and leaves the interface bare.
#[test]
fn auto_attaches_alone_on_a_bare_interface_and_libxdp_needs_freplace() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let _libxdp = LibxdpDir::hold();
    let net = VethPair::new("shau");
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--attach", "auto", "--metrics", "off", "--status-interval", "0", "--socket"])
        .arg(unique_socket("shau"));
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&rx, "control socket", scenario::DAEMON_START, &mut seen).unwrap();
    let status = loader_status(&net);
    let alone = listed_id(&status, " limiter ");
    assert!(alone.is_some(), "auto did not attach the limiter alone:\n{status}\n{seen}");
    let plain = alone.map(xlated);
    drop(daemon);
    std::thread::sleep(Duration::from_millis(300));
    // `libxdp`: it either joins (runs on) or refuses (exits) at once.
    let mut c = net.b.net_command(bin());
    c.args(["run", "--iface", B_IF, "--attach", "libxdp", "--metrics", "off", "--status-interval", "0", "--socket"])
        .arg(unique_socket("shau-lx"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Guard(c.spawn().unwrap());
    let start = Instant::now();
    let (exited, status) = loop {
        if let Some(code) = child.0.try_wait().unwrap() {
            break (Some(code), loader_status(&net));
        }
        let status = loader_status(&net);
        if status.contains("limiter_chain") || start.elapsed() > scenario::DAEMON_START {
            break (None, status);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if let Some(code) = exited {
        let mut err = String::new();
        child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        // No freplace at all (these machines), or (6.12) no component that
        // changes packet data in the slots of this libxdp's dispatcher.
        assert!(
            err.contains("refuses freplace") || err.contains("refuses a dispatcher component that changes packet data"),
            "--attach libxdp failed otherwise ({code}): {err}"
        );
        assert_eq!(code.code(), Some(1), "{err}");
        assert!(err.contains("--attach exclusive"), "{err}");
        assert!(listed_id(&status, "limiter").is_none(), "a refused start left a program:\n{status}");
        println!("--attach libxdp on this kernel: {}", err.trim());
    } else {
        // A kernel with freplace: the limiter is a component, before the
        // default priority (50), chained on XDP_PASS.
        let line = status.lines().find(|l| l.contains("limiter_chain")).unwrap_or_else(|| panic!("{status}"));
        assert!(line.contains(" 10 ") && line.contains("XDP_PASS"), "{status}");
        println!("--attach libxdp: {line}");
        // What the chain entry costs over the plain one: its translated
        // instructions, as the kernel runs them.
        let chain = listed_id(&status, "limiter_chain").map(xlated);
        println!("translated instructions: plain entry {plain:?}, chain entry {chain:?}");
        let (Some(plain), Some(chain)) = (plain, chain) else { panic!("{status}") };
        assert!(chain <= plain + 8, "the chain entry has {chain} instructions, the plain one {plain}");
        return;
    }
    println!("translated instructions of the plain entry: {plain:?} (no chain entry runs on this kernel to compare)");
}

/// Instructions of program `id` as the kernel translated them
/// (`bpftool prog dump xlated`: its subprograms too, which both entries
/// share, so two counts differ by what their entries do).
fn xlated(id: u32) -> usize {
    let o = Command::new("bpftool").args(["prog", "dump", "xlated", "id", &id.to_string()]).output().unwrap();
    assert!(o.status.success(), "bpftool: {}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .filter(|l| {
            l.trim_start().split(':').next().is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .count()
}

/// Kills the daemon when the test ends.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
