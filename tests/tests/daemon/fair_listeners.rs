//! Listener slots: with slots shared by all, any local user holding 32
//! `/metrics` connections and reopening them would make every scrape
//! fail, the feedback endpoint's 16 slots would fail the tenant's POSTs
//! the same way, and pipelined scrapes by one user would keep the daemon
//! at 100% of a core. Every listener now shares its slots per peer (per uid on the
//! control socket, per address and uid on loopback TCP), sheds the oldest
//! idle connection before refusing, and rate-limits scrapes per peer.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_IF, VethPair},
    scenario::{self, spawn_lines, unique_socket, wait_for},
};

const TOKEN: &str = "fair-listeners-token-5f0c9a1e7b";
/// The hostile local user: `nobody`, also let into the control socket
/// (its group), so it can hold connections there as a careless member of
/// the operators' group would.
const NOBODY: &str = "65534";

/// One HTTP/1.1 request on loopback `port` in `net`'s daemon namespace:
/// the status code and the body (0 when the connection failed or closed).
fn http(net: &VethPair, port: u16, req: String) -> (u16, String) {
    net.b.run_in(move || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
    })
}

/// `netload hold` as `nobody` in the daemon's namespace.
fn hostile(net: &VethPair, target: &str, count: u32, secs: u32, mode: &str) -> std::process::Child {
    let netload = scenario::locate_bin("netload").unwrap();
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", net.b.name))
        .args(["-S", NOBODY, "-G", NOBODY, "--"])
        .arg(netload)
        .args(["hold", target, &count.to_string(), &secs.to_string(), mode])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(c: std::process::Child) -> String {
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// User and system clock ticks the process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn count(report: &str, field: &str) -> u64 {
    report.split_whitespace().skip_while(|w| *w != field).nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn one_hostile_local_user_cannot_make_a_scrape_a_feedback_post_or_a_status_fail() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("fair");
    let tmp = TempDir::new("fair");
    let token = tmp.0.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let policy = tmp.0.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "rate = 1000\nburst = 2000\n\n[feedback]\nlisten = \"127.0.0.1:9465\"\ntoken_file = \"{}\"\n",
            token.display()
        ),
    )
    .unwrap();
    let socket: PathBuf = unique_socket("fair");
    let mut c = net.b.net_command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--socket-group", NOBODY, "--policy"])
        .arg(&policy)
        .arg("--socket")
        .arg(&socket);
    let (daemon, log) = spawn_lines(c).unwrap();
    let mut seen = String::new();
    wait_for(&log, "metrics on", Duration::from_secs(20), &mut seen).unwrap();

    // The hostile user: more connections than any listener has slots,
    // reopened all the time; on /metrics partial requests and pipelined
    // scrapes, on the feedback port partial requests, on the control
    // socket partial request lines (which it may send: it is in the group).
    let cpu0 = cpu_ticks(daemon.0.id());
    let secs = 14;
    let attackers = [
        hostile(&net, "tcp:127.0.0.1:9464", 64, secs, "slow"),
        hostile(&net, "tcp:127.0.0.1:9464", 8, secs, "scrape"),
        hostile(&net, "tcp:127.0.0.1:9465", 64, secs, "slow"),
        hostile(&net, &format!("unix:{}", socket.display()), 128, secs, "slow"),
    ];
    std::thread::sleep(Duration::from_millis(1500));

    let limiter = scenario::locate_bin("limiter").unwrap();
    let (mut scrapes, mut posts, mut statuses) = (0, 0, 0);
    let started = Instant::now();
    let mut failures = Vec::new();
    for i in 0..20u32 {
        let (code, body) = http(&net, 9464, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
        if code == 200 && body.contains("limiter_attached") {
            scrapes += 1;
        } else {
            failures.push(format!("scrape {i}: {code}"));
        }
        if i < 15 {
            let body = format!(r#"{{"prefix":"198.18.{}.0/24","ttl":"1m","reason":"fairness"}}"#, 100 + i);
            let req = format!(
                "POST /v1/penalties HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let (code, answer) = http(&net, 9465, req);
            if code == 200 {
                posts += 1;
            } else {
                failures.push(format!("post {i}: {code} {answer}"));
            }
        }
        let o = Command::new(&limiter).arg("status").arg("--socket").arg(&socket).output().unwrap();
        if o.status.success() {
            statuses += 1;
        } else {
            failures.push(format!("status {i}: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let during = started.elapsed();
    let reports: Vec<String> = attackers.into_iter().map(finish).collect();
    // SAFETY: sysconf has no preconditions.
    let hz = u32::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let cpu = f64::from(u32::try_from(cpu_ticks(daemon.0.id()) - cpu0).unwrap()) / f64::from(hz * secs);
    println!("the daemon used {:.0}% of a core during the attack", cpu * 100.0);
    println!(
        "under attack for {during:?}: {scrapes}/20 scrapes, {posts}/15 feedback POSTs, {statuses}/20 status answered; attackers: {reports:?}"
    );
    assert!(during < Duration::from_secs(u64::from(secs) - 1), "the probes outlasted the attack ({during:?})");
    assert!(failures.is_empty(), "{failures:?}");
    // The attack was real: every attacker opened hundreds of connections,
    // and the pipelining one was held to its rate (answered 429 past it).
    for r in &reports {
        assert!(count(r, "opened") >= 500, "an attacker did not get going: {r}");
    }
    let (ok, refused) = (count(&reports[1], "ok200"), count(&reports[1], "too_many"));
    assert!(refused > 0, "pipelined scrapes were never refused: {}", reports[1]);
    let per_sec = f64::from(u32::try_from(ok).unwrap()) / f64::from(secs);
    assert!(per_sec <= 10.0, "the hostile user got {per_sec:.1} scrapes/s answered");
    let logged: String = log.try_iter().collect::<Vec<_>>().join("\n");
    assert!(logged.contains("shed"), "no connection was shed: {logged}");
}
