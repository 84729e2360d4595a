//! The forwarder to the tenant layer with real peers: a client in its own
//! namespace (198.18.5.0/24) connects through XDP and the daemon's
//! forwarder to haproxy (`accept-proxy`), nginx (`proxy_protocol`), and a
//! test upstream that decodes the limiter's TLV; the caps shed at accept;
//! a dead upstream is taken out and comes back; SIGTERM drains; a reload
//! keeps it listening. (Long transfers and the hardening findings:
//! `forward_streams.rs`; the test bed: `limiter_tests::forward`.)

#![expect(clippy::many_single_char_names, reason = "short-lived handles in test threads")]

use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::TcpStream,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    forward::*,
    scenario::{self, Guard, spawn_lines, wait_for},
};

#[test]
fn haproxy_logs_the_clients_address() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwha", &forward(8443, &[9101], "proxy_protocol = \"v2\""));
    let cfg = s.tmp.0.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        "global\n  log stdout format raw local0\ndefaults\n  mode http\n  log global\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\nfrontend fe\n  bind 127.0.0.1:9101 accept-proxy\n  log-format \"client=%ci\"\n  http-request return status 200 content-type text/plain string ok\n",
    )
    .unwrap();
    let mut c = s.net.b.net_command("haproxy");
    c.arg("-db").arg("-f").arg(&cfg);
    let (haproxy, lines) = spawn_lines(c).unwrap();
    wait_listening(&s.net.b, 9101);
    let out = request(&s.net.a, 8443, "GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200"), "{out}");
    let mut log = String::new();
    wait_for(&lines, &format!("client={CLIENT}"), Duration::from_secs(5), &mut log).unwrap();
    drop::<Guard>(haproxy);
    drop(s);
}

#[test]
fn nginx_sees_the_clients_address() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwng", &forward(8443, &[9102], "proxy_protocol = \"v1\""));
    let dir = s.tmp.0.clone();
    let conf = dir.join("nginx.conf");
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nerror_log stderr;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/b;\n  proxy_temp_path {d}/p;\n  fastcgi_temp_path {d}/f;\n  uwsgi_temp_path {d}/u;\n  scgi_temp_path {d}/s;\n  server {{\n    listen 127.0.0.1:9102 proxy_protocol;\n    location / {{ return 200 \"addr=$proxy_protocol_addr\\n\"; }}\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let mut c = s.net.b.net_command("nginx");
    c.arg("-c").arg(&conf).arg("-p").arg(&dir).stdout(Stdio::null()).stderr(Stdio::null());
    let nginx = Guard(c.spawn().unwrap());
    wait_listening(&s.net.b, 9102);
    let out = request(&s.net.a, 8443, "GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    assert!(out.contains(&format!("addr={CLIENT}")), "{out}");
    drop(nginx);
}

#[test]
fn the_application_tlv_carries_the_verdict() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwtlv", &forward(8443, &[9103], ""));
    let stop = Arc::new(AtomicBool::new(false));
    let up = tlv_upstream(&s.net.b, 9103, Duration::ZERO, Arc::clone(&stop), Arc::default());
    thread::sleep(Duration::from_millis(200));
    let out = request(&s.net.a, 8443, "");
    let j: serde_json::Value = serde_json::from_str(out.lines().next().unwrap_or_default()).expect(&out);
    assert_eq!(j["src"].as_str().unwrap().split(':').next(), Some(CLIENT), "{j}");
    assert_eq!(j["dst"], format!("{FRONT}:8443"), "{j}");
    assert_eq!(
        (j["family"].as_u64(), j["prefix_len"].as_u64(), j["prefix"].as_str()),
        (Some(4), Some(24), Some("198.18.5.0")),
        "{j}"
    );
    assert_eq!(j["version"].as_u64(), status(&s)["policy_version"].as_u64(), "{j}");
    // The SYN went to class 1 ("syn": tcp/8443, shadow), burst 40: one
    // SYN charged, so at most 39 left and not much less.
    assert_eq!((j["class"].as_u64(), j["shadow"].as_bool()), (Some(1), Some(true)), "{j}");
    let left = j["remaining"].as_u64().unwrap();
    assert!((30..=39).contains(&left), "{j}");
    stop.store(true, Ordering::Relaxed);
    up.join().unwrap();
}

#[test]
fn at_the_cap_new_connections_are_closed_at_once_and_a_dead_upstream_is_routed_around() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup(
        "fwcap",
        &forward(8443, &[9104, 9105], "max_connections = 100\ncritical_reserve = 0\nconnect_timeout = \"500ms\""),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (served_a, served_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let hold = Duration::from_secs(4);
    let a = tlv_upstream(&s.net.b, 9104, hold, Arc::clone(&stop), Arc::clone(&served_a));
    let b = tlv_upstream(&s.net.b, 9105, hold, Arc::clone(&stop), Arc::clone(&served_b));
    thread::sleep(Duration::from_millis(200));
    let rss = || {
        let st = std::fs::read_to_string(format!("/proc/{}/status", s.daemon.0.id())).unwrap();
        st.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse::<u64>().ok()).unwrap()
    };
    let idle_rss = rss();
    let mut held_rss = 0;
    // 1,000 concurrent connections at a cap of 100.
    let (answered, closed) = s.net.a.run_in(|| {
        let conns: Vec<TcpStream> = (0..1000).filter_map(|_| TcpStream::connect((FRONT, 8443)).ok()).collect();
        thread::sleep(Duration::from_millis(300));
        held_rss = rss();
        let (mut answered, mut closed) = (0, 0);
        for mut c in conns {
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut line = String::new();
            match BufReader::new(&mut c).read_line(&mut line) {
                Ok(n) if n > 0 => answered += 1,
                Ok(_) => closed += 1,
                Err(_) => {}
            }
        }
        (answered, closed)
    });
    let j = status(&s);
    let shed = j["forwards"][0]["shed"][0][1].as_u64().unwrap();
    println!(
        "1,000 connections at a cap of 100: {answered} served, {closed} closed at once; shed max_connections {shed}"
    );
    println!(
        "daemon RSS {idle_rss} kB idle, {held_rss} kB with 100 connections open: about {} kB a connection",
        held_rss.saturating_sub(idle_rss) / 100
    );
    assert_eq!(answered, 100, "{j}");
    assert_eq!(closed, 900, "{j}");
    assert!(shed >= 900, "{j}");
    thread::sleep(hold);
    // Upstream A dies: its connect fails once, then traffic goes to B.
    stop.store(true, Ordering::Relaxed);
    a.join().unwrap();
    b.join().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let served_b = Arc::new(AtomicUsize::new(0));
    let b = tlv_upstream(&s.net.b, 9105, Duration::ZERO, Arc::clone(&stop), Arc::clone(&served_b));
    thread::sleep(Duration::from_millis(200));
    for _ in 0..10 {
        let out = request(&s.net.a, 8443, "");
        assert!(out.contains("\"port\":9105"), "a connection was lost to the dead upstream: {out:?}");
    }
    let j = status(&s);
    let f = &j["forwards"][0];
    assert!(f["upstream_connect_failures"].as_u64().unwrap() >= 1, "{f}");
    assert_eq!(f["upstreams"][0][1].as_bool(), Some(false), "A out of service: {f}");
    // A comes back: after its back-off it serves again.
    let served_a = Arc::new(AtomicUsize::new(0));
    let a = tlv_upstream(&s.net.b, 9104, Duration::ZERO, Arc::clone(&stop), Arc::clone(&served_a));
    let start = Instant::now();
    while served_a.load(Ordering::Relaxed) == 0 && start.elapsed() < Duration::from_secs(10) {
        let _ = request(&s.net.a, 8443, "");
        thread::sleep(Duration::from_millis(200));
    }
    assert!(served_a.load(Ordering::Relaxed) > 0, "the upstream never came back into service");
    stop.store(true, Ordering::Relaxed);
    a.join().unwrap();
    b.join().unwrap();
}

#[test]
fn sigterm_drains_connections_in_flight() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwdr", &forward(8443, &[9106], "drain_timeout = \"8s\""));
    let stop = Arc::new(AtomicBool::new(false));
    let up = tlv_upstream(&s.net.b, 9106, Duration::from_secs(2), Arc::clone(&stop), Arc::default());
    thread::sleep(Duration::from_millis(200));
    // 50 connections in flight, each answered, then held 2 s and closed
    // by the upstream: a connection finished is one that sees its end.
    let finished = s.net.a.run_in(|| {
        let conns: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect((FRONT, 8443)).unwrap()).collect();
        thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(i32::try_from(s.daemon.0.id()).unwrap(), libc::SIGTERM) };
        conns
            .into_iter()
            .filter(|c| {
                c.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
                let mut all = String::new();
                (&*c).read_to_string(&mut all).is_ok() && all.contains("\"src\"")
            })
            .count()
    });
    let mut log = String::new();
    wait_for(&s.log, "drained", Duration::from_secs(10), &mut log).unwrap();
    println!("SIGTERM with 50 connections in flight: {finished} finished");
    assert_eq!(finished, 50, "{log}");
    stop.store(true, Ordering::Relaxed);
    up.join().unwrap();
}

/// A reload that changes a forwarder on the same address keeps it
/// listening: the new forwarder takes over the old one's socket (before,
/// the rebind failed with "address in use" and the forwarder stopped
/// listening).
#[test]
fn a_changed_forwarder_keeps_listening_across_a_reload() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwrl", &forward(8443, &[9107], "max_connections = 100"));
    let stop = Arc::new(AtomicBool::new(false));
    let up = tlv_upstream(&s.net.b, 9107, Duration::ZERO, Arc::clone(&stop), Arc::default());
    thread::sleep(Duration::from_millis(200));
    assert!(request(&s.net.a, 8443, "").contains("\"src\""));
    let policy = s.tmp.0.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap().replace("max_connections = 100", "max_connections = 50");
    std::fs::write(&policy, text).unwrap();
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["policy", "apply", "--socket"])
        .arg(&s.socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    thread::sleep(Duration::from_millis(200));
    let j = status(&s);
    assert_eq!(j["forwards"][0]["bind_errors"].as_array().map(Vec::len), Some(0), "{j}");
    assert_eq!(j["forwards"][0]["listening"][0], format!("{FRONT}:8443"), "{j}");
    assert!(request(&s.net.a, 8443, "").contains("\"src\""), "not served after the reload");
    stop.store(true, Ordering::Relaxed);
    up.join().unwrap();
}
