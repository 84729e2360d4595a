//! The clients, the listener and the namespaces of the SYN flood tests.

use super::*;

/// The `i`-th client source: its own /32 or /64, outside the flood's range.
pub(super) fn client_addr(v6: bool, i: usize) -> IpAddr {
    if v6 {
        format!("2001:2:0:{:x}::7", 0x100 + i).parse().unwrap()
    } else {
        format!("198.18.2.{}", i + 1).parse().unwrap()
    }
}

/// Connect from `src`, read the server's greeting: the connect time, or
/// why it failed.
pub(super) fn connect_once(src: IpAddr, dst: SocketAddr) -> anyhow::Result<Duration> {
    use anyhow::Context as _;
    let domain = if dst.is_ipv6() { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(domain, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(src, 0).into()).with_context(|| format!("bind {src}"))?;
    let start = Instant::now();
    s.connect_timeout(&dst.into(), Duration::from_secs(5)).with_context(|| format!("connect from {src}"))?;
    let took = start.elapsed();
    let mut c: std::net::TcpStream = s.into();
    c.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut hello = [0u8; 3];
    c.read_exact(&mut hello).with_context(|| format!("greeting to {src} after {took:?}"))?;
    anyhow::ensure!(&hello == b"hi\n", "greeting {hello:?}");
    Ok(took)
}

/// The server: greets every connection it accepts until `stop`.
pub(super) fn serve(listener: &TcpListener, stop: &AtomicBool) -> usize {
    listener.set_nonblocking(true).unwrap();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut c, _)) => {
                let _ = c.set_nonblocking(false);
                let _ = c.write_all(b"hi\n");
                n += 1;
            }
            Err(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
    n
}

pub(super) struct StopOnDrop<'a>(pub(super) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The `pct`-th percentile of sorted times, in ms (nearest rank).
pub(super) fn percentile(sorted: &[Duration], pct: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) * pct).div_ceil(100);
    sorted[i].as_secs_f64() * 1e3
}

/// `CLIENTS` sequential connections from new prefixes `first..`: connect
/// times sorted, or the failures.
pub(super) fn clients(net: &VethPair, v6: bool, first: usize, n: usize, dst: SocketAddr) -> Vec<Duration> {
    let results: Vec<anyhow::Result<Duration>> =
        net.a.run_in(|| (first..first + n).map(|i| connect_once(client_addr(v6, i), dst)).collect());
    let failed: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|e| format!("{e:#}")).collect();
    assert!(failed.is_empty(), "{} of {n} connections failed: {failed:?}", failed.len());
    let mut t: Vec<Duration> = results.into_iter().map(Result::unwrap).collect();
    t.sort();
    t
}

/// `limiter VERB -j` against the daemon at `socket`, parsed.
pub(super) fn limiter_json(verb: &str, socket: &std::path::Path) -> serde_json::Value {
    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args([verb, "-j", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Prefixes with a bucket, as the daemon counted them in a count that
/// began after this call (its count runs in the background every 2 s, or
/// less often while a count takes long: under QEMU's emulator in the
/// guest tier a count held still for seconds was an old one); at most
/// 60 s.
pub(super) fn tracked(socket: &std::path::Path) -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let start = Instant::now();
    loop {
        let s = limiter_json("status", socket);
        let at = u128::from(s["tracked_at_ms"].as_u64().unwrap());
        if at > since {
            return s["tracked"].as_u64().unwrap();
        }
        assert!(start.elapsed() < Duration::from_mins(1), "no count of the buckets began in 60 s: {s}");
        thread::sleep(Duration::from_millis(200));
    }
}

/// `limiter run` with [`POLICY`] (written into `dir`) on the receiving
/// end, controlled on `socket`: the daemon, the rest of its output (keep
/// it: dropping it would close the daemon's stdout) and its log up to the
/// control socket's line.
pub(super) fn start_daemon(
    net: &VethPair,
    dir: &std::path::Path,
    socket: &std::path::Path,
) -> (scenario::Guard, std::sync::mpsc::Receiver<String>, String) {
    std::fs::create_dir_all(dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--policy"]).arg(&policy);
    c.arg("--socket").arg(socket);
    let (daemon, rx) = spawn_lines(c).unwrap();
    let mut log = String::new();
    wait_for(&rx, "control socket", scenario::DAEMON_START, &mut log).unwrap();
    (daemon, rx, log)
}

/// How the protected host routes back to the flood's sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Routes {
    /// The whole test range on-link (the pair's own routes).
    OnLink,
    /// Routes to the clients only: no route back to the spoofed sources
    /// (a host without a default route on that interface).
    ClientsOnly,
    /// A default route through the veth (its other end is the test's own
    /// namespace, so nothing leaves the machine), as real edge hosts have.
    Default,
}

/// The pair, its client addresses and its routes; the kernel of the
/// DUT namespace takes cookie ACKs (`tcp_syncookies = 2`).
pub(super) fn setup(v6: bool, routes: Routes) -> VethPair {
    let tag = match (v6, routes) {
        (true, _) => "sc6",
        (false, Routes::OnLink) => "sc4",
        (false, Routes::ClientsOnly) => "sc4n",
        (false, Routes::Default) => "sc4d",
    };
    let net = VethPair::new(tag);
    if routes != Routes::OnLink {
        net.b.ip(&format!("route del 198.18.0.0/15 dev {B_IF}"));
        match routes {
            // The clients are 198.18.2.x; the flood's sources from 198.18.4.0 on.
            Routes::ClientsOnly => net.b.ip(&format!("route add 198.18.2.0/24 dev {B_IF}")),
            _ => net.b.ip(&format!("route add default dev {B_IF}")),
        }
    }
    for i in 0..2 * CLIENTS {
        if v6 {
            net.a.ip(&format!("addr add {}/128 dev {A_IF} nodad", client_addr(true, i)));
        } else {
            net.add_source(&client_addr(false, i).to_string());
        }
    }
    if !v6 {
        // No IPv6 on the link: its neighbour discovery would get a bucket too.
        for (ns, dev) in [(&net.a, A_IF), (&net.b, B_IF)] {
            let off = ns.command("sysctl").args(["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]).status();
            assert!(off.unwrap().success());
        }
    }
    if v6 {
        net.a.ip(&format!("addr add 2001:2::1/64 dev {A_IF} nodad"));
        net.b.ip(&format!("addr add {B_ADDR6}/64 dev {B_IF} nodad"));
        net.b.ip(&format!("route add 2001:2::/48 dev {B_IF}"));
    }
    // The kernel takes the ACKs of XDP's cookies with cookies always on
    // (in this namespace only).
    let sysctl = net.b.command("sysctl").args(["-qw", "net.ipv4.tcp_syncookies=2"]).status().unwrap();
    assert!(sysctl.success());
    net
}
