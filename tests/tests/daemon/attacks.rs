//! Attacks as records through the daemon: a flood of three prefixes at
//! two ports (two classes; the record names both ports) starts an attack
//! within `sustain` + 2 s, told
//! to a webhook (a receiver written here) with the three prefixes as the
//! top sources at their shares; an operator's deny during it is in its
//! record; it ends after `quiet`; the record is in `limiter attacks`, in
//! the attacks file, and read back after a restart; an https receiver
//! (nginx with a certificate of a CA the policy names) is told the same
//! events. Three more webhooks
//! never answer, answer 500, or read one byte a second: each is counted
//! as failing in `limiter status` and the metrics, and none slows the
//! control socket.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::Stdio,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{B_ADDR, B_IF, VethPair},
    scenario::{self, Guard, metric, scrape, spawn_lines, unique_socket, wait_for},
};

/// How a test receiver answers.
#[derive(Clone, Copy)]
enum Receiver {
    /// Reads the request, answers 200, and hands the body on.
    Ok,
    /// Reads the request, answers 500.
    Error,
    /// Takes the connection and never reads or answers.
    Never,
    /// Reads one byte a second, never answers.
    Slow,
}

/// How long a receiver serves.
const SERVES: Duration = Duration::from_secs(90);

/// A receiver on 127.0.0.1 in the daemon's namespace: its port, and the
/// bodies it was sent (`Receiver::Ok` only).
fn receiver(net: &VethPair, kind: Receiver) -> (u16, mpsc::Receiver<String>) {
    let listener = net.b.run_in(|| TcpListener::bind("127.0.0.1:0").unwrap());
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (start, mut held) = (Instant::now(), Vec::new());
        while start.elapsed() < SERVES {
            let Ok((s, _)) = listener.accept() else {
                thread::sleep(Duration::from_millis(20));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            match kind {
                Receiver::Ok | Receiver::Error => {
                    let body = request_body(&s);
                    let status = if matches!(kind, Receiver::Ok) { "200 OK" } else { "500 Internal Server Error" };
                    let _ = (&s).write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
                    if matches!(kind, Receiver::Ok) && tx.send(body).is_err() {
                        return;
                    }
                }
                Receiver::Never => held.push(s),
                Receiver::Slow => {
                    thread::spawn(move || {
                        let mut byte = [0u8; 1];
                        for _ in 0..30 {
                            if (&s).read(&mut byte).unwrap_or(0) == 0 {
                                break;
                            }
                            thread::sleep(Duration::from_secs(1));
                        }
                    });
                }
            }
        }
    });
    (port, rx)
}

/// The body of the HTTP request on `s` (by its Content-Length).
fn request_body(mut s: &TcpStream) -> String {
    let (mut buf, mut byte) = (Vec::new(), [0u8; 1]);
    while !buf.ends_with(b"\r\n\r\n") && buf.len() < 8192 && s.read(&mut byte).unwrap_or(0) == 1 {
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    let len: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; len.min(1 << 20)];
    let _ = s.read_exact(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}

/// The next body the receiver was sent whose event is `event`, within
/// `timeout`.
fn next_event(rx: &mpsc::Receiver<String>, event: &str, timeout: Duration) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let body = rx.recv_timeout(left).unwrap_or_else(|_| panic!("no '{event}' within {timeout:?}"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        if v["event"] == event {
            return v;
        }
    }
}

fn start(net: &VethPair, policy: &Path, socket: &Path, attacks: &Path) -> (Guard, mpsc::Receiver<String>) {
    let mut cmd = net.b.command(scenario::locate_bin("limiter").unwrap());
    cmd.args(["run", "--iface", B_IF, "--status-interval", "0", "--policy"]).arg(policy);
    cmd.arg("--socket").arg(socket).arg("--attacks").arg(attacks);
    let (g, rx) = spawn_lines(cmd).unwrap();
    wait_for(&rx, "attached", scenario::DAEMON_START, &mut String::new()).unwrap();
    (g, rx)
}

/// The share named `name` in `shares` (a record's `sources` or
/// `classes`).
fn share_of(shares: &serde_json::Value, name: &str) -> f64 {
    shares.as_array().unwrap().iter().find(|s| s["name"] == name).map_or(0.0, |s| s["share"].as_f64().unwrap())
}

/// The port of the https receiver's TLS front (in the test's namespace).
const TLS_PORT: u16 = 9443;

/// A CA and a certificate it signed for 127.0.0.1 (`leaf.pem`,
/// `leaf.key`), made with Debian's openssl in `dir`; the CA's path.
fn make_ca(dir: &Path) -> std::path::PathBuf {
    let run = |args: &[&str]| {
        let o = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=limiter test CA"]].concat());
    run(&[&["req"][..], &ec, &["-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(dir.join("leaf.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    run(&["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext"]);
    dir.join("ca.pem")
}

/// nginx terminating TLS on 127.0.0.1:`port` (with `dir`'s leaf) in
/// front of 127.0.0.1:`backend`, in the daemon's namespace.
fn tls_front(net: &VethPair, dir: &Path, port: u16, backend: u16) -> Guard {
    let d = dir.display();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nerror_log stderr;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
             client_body_temp_path {d}/b;\n  proxy_temp_path {d}/p;\n  fastcgi_temp_path {d}/f;\n  uwsgi_temp_path {d}/u;\n  \
             scgi_temp_path {d}/s;\n  server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {d}/leaf.pem;\n    \
             ssl_certificate_key {d}/leaf.key;\n    location / {{ proxy_pass http://127.0.0.1:{backend}; }}\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let mut c = net.b.net_command("nginx");
    c.arg("-c").arg(&conf).arg("-p").arg(dir).stdout(Stdio::null()).stderr(Stdio::null());
    let g = Guard(c.spawn().expect("nginx (cargo xtask setup installs it)"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while net.b.run_in(|| TcpStream::connect(("127.0.0.1", port))).is_err() {
        assert!(Instant::now() < deadline, "nginx does not listen on {port}");
        thread::sleep(Duration::from_millis(50));
    }
    g
}

const NETS: [&str; 3] = ["198.18.41", "198.18.42", "198.18.43"];
const SUSTAIN: u64 = 2;
const QUIET: u64 = 4;

#[test]
#[expect(clippy::too_many_lines, reason = "one attack, from its start to its record read back after a restart")]
fn a_flood_is_an_attack_with_a_record_told_to_webhooks() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let net = VethPair::new("at");
    let (ok_port, bodies) = receiver(&net, Receiver::Ok);
    let (error_port, _) = receiver(&net, Receiver::Error);
    let (never_port, _) = receiver(&net, Receiver::Never);
    let (slow_port, _) = receiver(&net, Receiver::Slow);
    let hook = |port: u16, path: &str| format!("\"http://127.0.0.1:{port}/{path}\"");
    let dir = TempDir::new("attacks");
    // An https receiver: nginx with a certificate of a CA made here, in
    // front of one more receiver; the daemon trusts the CA (webhook_ca).
    let (tls_backend, tls_bodies) = receiver(&net, Receiver::Ok);
    let ca = make_ca(&dir.0);
    let _nginx = tls_front(&net, &dir.0, TLS_PORT, tls_backend);
    let policy = dir.0.join("limiter.toml");
    // An AS file says where the first /24 is (a shadow group loads it,
    // changing nothing): the record names its AS.
    let asn_file = dir.0.join("asn.csv");
    std::fs::write(&asn_file, format!("{}.0/24,64500\n", NETS[0])).unwrap();
    std::fs::write(
        &policy,
        format!(
            "[[class]]\nname = \"web\"\nprotocol = \"udp\"\nports = [7001]\nrate = 1000\nburst = 200\n\n[[class]]\n\
             name = \"dns\"\nprotocol = \"udp\"\nports = [7002]\nrate = 1000\nburst = 200\n\n[attacks]\n\
             drops_per_sec = 3000\nsustain = \"{SUSTAIN}s\"\nquiet = \"{QUIET}s\"\nwebhook_timeout = \"1s\"\n\
             webhooks = [{}, {}, {}, {}, \"https://127.0.0.1:{TLS_PORT}/tls\"]\nwebhook_ca = \"{}\"\n\n[[group]]\nname = \"as64500\"\npath = \"{}\"\nasns = [64500]\n\
             rate = 10000000\nshadow = true\nallow_bogons = true\n",
            hook(ok_port, "hook"),
            hook(error_port, "error"),
            hook(never_port, "never"),
            hook(slow_port, "slow"),
            ca.display(),
            asn_file.display(),
        ),
    )
    .unwrap();
    let (socket, file) = (unique_socket("attacks"), dir.0.join("attacks.jsonl"));
    let (daemon, log) = start(&net, &policy, &socket, &file);
    wait_for(&log, "group as64500: 1 networks", Duration::from_secs(20), &mut String::new()).unwrap();
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.0.id())).unwrap();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").parse::<u64>().unwrap()
    };
    let rss_before = rss();

    // Each /24 sends 5,000/s to the web port and 2,000/s to the dns port
    // (1,000/s of each admitted): 4,000 + 1,000 refused a second each,
    // 15,000 in all; web's share of them 4/5.
    let netload = scenario::locate_bin("netload").unwrap();
    let (mac, nets) = (net.b_mac(), NETS.join(","));
    let flood = |port: u16, pps: u32| {
        let mut c = net.a.command(&netload);
        c.args(["spoof-prefix", "va", &mac, &format!("{B_ADDR}:{port}"), &nets, &pps.to_string(), "9"]);
        Guard(c.stdout(Stdio::null()).spawn().unwrap())
    };
    let began = Instant::now();
    let floods = [flood(7001, 15_000), flood(7002, 6_000)];

    let started = next_event(&bodies, "started", Duration::from_secs(SUSTAIN + 2));
    let over_tls = next_event(&tls_bodies, "started", Duration::from_secs(5));
    assert_eq!(over_tls["attack"]["id"], started["attack"]["id"], "{over_tls}");
    println!("started after {:.1} s: {started}", began.elapsed().as_secs_f64());
    let a = &started["attack"];
    let id = a["id"].as_u64().unwrap();
    assert!(a["ended"].is_null() && a["peak_pps"].as_u64().unwrap() >= 3_000, "{started}");
    let top: Vec<&str> = a["sources"].as_array().unwrap().iter().take(3).map(|s| s["name"].as_str().unwrap()).collect();
    for n in NETS {
        let share = share_of(&a["sources"], &format!("{n}.0/24"));
        assert!((0.25..=0.4167).contains(&share), "{n}.0/24 at {share} (a third, within 25%), top {top:?}");
        let source = a["sources"].as_array().unwrap().iter().find(|s| s["name"] == format!("{n}.0/24")).unwrap();
        let asn = if n == NETS[0] { Some(64500) } else { None };
        assert_eq!(source["asn"].as_u64(), asn, "{source}");
    }

    // While the three failing webhooks hold their tries, the control
    // socket answers at once.
    let client = limiter::control::client::Client::new(&socket);
    let worst = (0..20)
        .map(|_| {
            let t = Instant::now();
            client.status().unwrap();
            let took = t.elapsed();
            thread::sleep(Duration::from_millis(50));
            took
        })
        .max()
        .unwrap();
    println!("control socket: slowest status of 20 during the attack {worst:?}");
    assert!(worst < Duration::from_millis(100), "{worst:?}");

    // The metrics while it goes on: active, and each class's share.
    let m = scrape(&net);
    let share = |class: &str| -> f64 {
        let series = format!("limiter_attack_class_share{{class=\"{class}\"}}");
        m.lines()
            .find_map(|l| l.strip_prefix(series.as_str()).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{series} not in:\n{m}"))
    };
    let (web, dns) = (share("web"), share("dns"));
    println!("metrics during the attack: limiter_attack_class_share web {web:.3} dns {dns:.3}");
    assert_eq!(metric(&m, "limiter_attack_active"), 1);
    assert!((0.6..=1.0).contains(&web) && dns > 0.1 && (web + dns - 1.0).abs() < 1e-6, "web {web} dns {dns}");

    // The operator acts during it.
    let o = scenario::cli(&socket, &["prefix", "deny", "198.18.43.0/24", "--ttl", "10m", "--reason", "attack 1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The floods run 6 s in all, then stop.
    thread::sleep(Duration::from_secs(6).saturating_sub(began.elapsed()));
    drop(floods);
    let ended = next_event(&bodies, "ended", Duration::from_secs(QUIET + 3));
    assert_eq!(next_event(&tls_bodies, "ended", Duration::from_secs(5))["attack"], ended["attack"]);
    println!("ended after {:.1} s: {ended}", began.elapsed().as_secs_f64());
    let a = &ended["attack"];
    assert_eq!(a["id"].as_u64(), Some(id));
    assert!(a["ended"].as_u64().is_some() && a["duration_secs"].as_u64().unwrap() >= 5, "{ended}");
    let web = share_of(&a["classes"], "web");
    assert!((0.6..=1.0).contains(&web) && share_of(&a["classes"], "dns") > 0.1, "web {web}: {ended}");
    // The ports, read from the sampled drops: as the classes, web's 7001
    // about 4/5.
    let (p7001, p7002) = (share_of(&a["ports"], "udp/7001"), share_of(&a["ports"], "udp/7002"));
    assert!((0.6..=1.0).contains(&p7001) && p7002 > 0.1 && p7001 + p7002 > 0.99, "ports {}", a["ports"]);
    let reasons: Vec<&str> = a["reasons"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert!(reasons.contains(&"rate_limited") && reasons.contains(&"denied"), "{reasons:?}");
    let deny = a["actions"].as_array().unwrap().iter().find(|x| {
        x["what"].as_str().is_some_and(|w| w.starts_with("prefix deny 198.18.43.0/24 ttl 600 reason \"attack 1\""))
    });
    let deny = deny.unwrap_or_else(|| panic!("the operator's deny is not in the record: {ended}"));
    assert!(deny["by"].as_str().unwrap().starts_with("uid 0 pid "), "{deny}");
    assert!(a["passed"]["packets"].as_u64().unwrap() > 0 && a["refused"]["packets"].as_u64().unwrap() > 40_000);
    assert_eq!(ended["host"].as_str().map(str::is_empty), Some(false));

    // limiter attacks: the same record, and the file's last line of it.
    let o = scenario::cli(&socket, &["attacks", "show", &id.to_string(), "-j"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(shown, *a);
    let text = String::from_utf8(scenario::cli(&socket, &["attacks"]).stdout).unwrap();
    println!("{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with(&format!("{id} ")) && l.contains("ended")), "{text}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "one line at its start, one at its end");
    assert_eq!(lines[1], *a);

    // The failing webhooks: counted, and said in the status; the metrics.
    thread::sleep(Duration::from_secs(2));
    // What the daemon holds for them is bounded by their queues (32
    // events each): its memory after the attack, beside before it.
    let rss_after = rss();
    println!("daemon RSS before the attack {rss_before} kB, after it {rss_after} kB");
    assert!(rss_after < rss_before + 32 * 1024, "{rss_before} kB -> {rss_after} kB");
    let status = String::from_utf8(scenario::cli(&socket, &["status"]).stdout).unwrap();
    println!("{status}");
    let line = |port: u16| {
        status.lines().find(|l| l.contains(&format!(":{port}/"))).unwrap_or_else(|| panic!("{status}")).to_owned()
    };
    assert!(line(error_port).contains("FAILING: answered 500"), "{status}");
    assert!(line(never_port).contains("FAILING: no answer within"), "{status}");
    assert!(line(slow_port).contains("FAILING"), "{status}");
    assert!(line(ok_port).contains("delivered") && !line(ok_port).contains("FAILING"), "{status}");
    assert!(line(TLS_PORT).contains("https://") && !line(TLS_PORT).contains("FAILING"), "{status}");
    let m = scrape(&net);
    let hook_url = format!("http://127.0.0.1:{ok_port}/hook");
    assert!(metric(&m, &format!("limiter_attack_webhooks_total{{webhook=\"{hook_url}\",result=\"delivered\"}}")) >= 2);
    assert_eq!(metric(&m, "limiter_attacks_total"), 1);
    assert_eq!(metric(&m, "limiter_attack_active"), 0);
    assert!(!m.contains("limiter_attack_class_share{"), "a class's share without an attack");

    // Restarted, the daemon still has it.
    drop(daemon);
    let (_daemon, _log) = start(&net, &policy, &socket, &file);
    let o = scenario::cli(&socket, &["attacks", "-j"]);
    let kept: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(kept["attacks"][0], *a, "{kept}");
}
