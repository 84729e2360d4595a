//! The control plane under attack by its own users and careless operators:
//! descriptor exhaustion, slow and silent clients, oversized lines, socket
//! takeover, pin-directory contention, loss of the attachment, quadratic
//! and endless policy inputs. Every listener must come back, every limit
//! must hold, and the daemon must never claim protection that is not there.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use limiter_tests::{
    kernel::{TempDir, require_root},
    netns::{A_IF, B_IF, NetNs, VethPair},
    scenario::{self, Guard, spawn_lines, unique_socket, wait_for},
};

mod groups;
mod harness;
mod upstream;

use self::harness::*;

/// With its descriptors exhausted by held connections, both listeners
/// keep accepting once they are released (they must not end for good on
/// the first accept error).
#[test]
fn descriptor_exhaustion_does_not_end_the_listeners() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adfd");
    // A hard limit the daemon cannot raise: a few dozen spare descriptors.
    let d = start_in(&net.b, B_IF, "adfd", &[], |c| unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 96, rlim_max: 96 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    });
    let mut log = String::new();
    let held_tcp =
        net.b.run_in(|| (0..200).filter_map(|_| TcpStream::connect("127.0.0.1:9464").ok()).collect::<Vec<_>>());
    let held_unix: Vec<UnixStream> = (0..200).filter_map(|_| UnixStream::connect(&d.socket).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    log.push_str(&d.drain());
    assert!(log.contains("accept failed") || log.contains("connections in use"), "no sign of exhaustion: {log}");
    drop(held_tcp);
    drop(held_unix);
    // Back within the accept loop's longest back-off.
    let start = Instant::now();
    let back = loop {
        let ok = cli(&d.socket, &["status"]).status.success() && scrape(&net).contains("limiter_attached");
        if ok || start.elapsed() > Duration::from_secs(10) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("listeners answered again {:?} after the descriptors were released", start.elapsed());
    assert!(back, "a listener did not come back: {}", d.drain());
}

/// Slow and silent clients are cut off at their deadline,
/// excess clients are closed at accept, and meanwhile others are served.
#[test]
fn slow_clients_are_cut_off_while_others_are_served() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adsl");
    let d = start(&net, "adsl", &[]);
    // Half-sent HTTP requests and half-sent control lines.
    let slow_http: Vec<TcpStream> = net.b.run_in(|| {
        (0..20)
            .map(|_| {
                let mut s = TcpStream::connect("127.0.0.1:9464").unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                s
            })
            .collect()
    });
    let slow_ctl: Vec<UnixStream> = (0..20)
        .map(|_| {
            let mut s = UnixStream::connect(&d.socket).unwrap();
            s.write_all(br#"{"cmd":"sta"#).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            s
        })
        .collect();
    // Others are served meanwhile.
    assert!(scrape(&net).contains("limiter_attached"), "a scrape waited behind slow clients");
    assert!(cli(&d.socket, &["status"]).status.success());
    // One peer keeps at most its share of the slots (8 of 32): past it,
    // its oldest idle connection is shed for each new one.
    let extra: Vec<TcpStream> = net.b.run_in(|| {
        (0..40)
            .map(|_| {
                let s = TcpStream::connect("127.0.0.1:9464").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                s
            })
            .collect()
    });
    let closed_at_once = extra.into_iter().filter(|s| closed_within(&mut &*s, Duration::from_millis(500))).count();
    println!("of 40 more metrics connections over 20 slow ones (8 per peer), {closed_at_once} were closed at once");
    assert!(closed_at_once >= 40 - 12, "the cap did not hold: {closed_at_once}");
    // Each slow client is cut off at its deadline (5 s for HTTP headers,
    // 10 s for a control line).
    let start = Instant::now();
    for mut s in slow_http {
        assert!(closed_within(&mut s, Duration::from_secs(8)), "a slow HTTP client was never cut off");
    }
    for mut s in slow_ctl {
        assert!(closed_within(&mut s, Duration::from_secs(14)), "a slow control client was never cut off");
    }
    println!("slow clients cut off {:?} after the checks began", start.elapsed());
    assert!(scrape(&net).contains("limiter_attached"));
}

/// A line without end is refused at the cap; only one client at a
/// time may hold a large buffer; the daemon's memory stays small.
#[test]
fn oversized_request_lines_are_refused_without_growing_memory() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adln");
    let d = start(&net, "adln", &[]);
    let before = vm_rss_kb(d.pid());
    let socket = d.socket.clone();
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(&socket).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
                let chunk = vec![b'x'; 1 << 20];
                for _ in 0..64 {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
                let mut answer = String::new();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let _ = s.read_to_string(&mut answer);
                answer
            })
        })
        .collect();
    let answers: Vec<String> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let after = vm_rss_kb(d.pid());
    println!("daemon RSS {before} kB before, {after} kB after 8 clients x 64 MiB without a newline");
    for a in &answers {
        assert!(a.contains("longer than") || a.contains("another large request"), "{a}");
    }
    assert!(after < before + 120 * 1024, "RSS grew from {before} to {after} kB");
    assert!(cli(&d.socket, &["status"]).status.success());
}

/// A second daemon cannot take a live daemon's socket; a path
/// that is not a socket is never deleted.
#[test]
fn a_live_socket_cannot_be_taken_and_a_file_is_never_deleted() {
    let _alone = limiter_tests::alone(module_path!());
    let (net, other) = (VethPair::new("adsk"), VethPair::new("adsk2"));
    let d = start(&net, "adsk", &[]);
    let o = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", other.b.name))
        .arg(bin())
        .args(["run", "--iface", B_IF, "--metrics", "off", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("served by another running limiter daemon"), "{err}");
    assert!(cli(&d.socket, &["status"]).status.success(), "the first daemon lost its socket");
    // A regular file as the socket path: refused, left as it was.
    let tmp = TempDir::new("adsk");
    let file = tmp.0.join("precious.txt");
    std::fs::write(&file, "keep me").unwrap();
    let o = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", other.b.name))
        .arg(bin())
        .args(["run", "--iface", B_IF, "--metrics", "off", "--socket"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(stderr(&o).contains("is not a socket"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // Another program's live socket (no limiter lock beside it): left
    // alone, or that program would be cut off.
    let theirs = tmp.0.join("theirs.sock");
    let listener = std::os::unix::net::UnixListener::bind(&theirs).unwrap();
    let o = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", other.b.name))
        .arg(bin())
        .args(["run", "--iface", B_IF, "--metrics", "off", "--socket"])
        .arg(&theirs)
        .output()
        .unwrap();
    assert!(stderr(&o).contains("another program is serving"), "{}", stderr(&o));
    assert!(std::os::unix::net::UnixStream::connect(&theirs).is_ok(), "their socket was taken");
    drop(listener);
}

struct Pins(PathBuf);
impl Drop for Pins {
    fn drop(&mut self) {
        let _ = limiter::dataplane::pin::unload(&self.0, false);
    }
}

/// One daemon per pin directory; `limiter unload` refuses
/// while it runs; forced, the daemon notices the loss, says so, and pins
/// its link again.
#[test]
fn one_daemon_per_pin_directory_and_what_unload_removes_comes_back() {
    let _alone = limiter_tests::alone(module_path!());
    let (net, other) = (VethPair::new("adpn"), VethPair::new("adpn2"));
    let dir = PathBuf::from(format!("/sys/fs/bpf/limiter-test-adpn-{}", std::process::id()));
    let _pins = Pins(dir.clone());
    let pin_args = ["--pin", "--pin-dir", dir.to_str().unwrap()];
    let d = start(&net, "adpn", &pin_args);
    let o = other.b.net_command(bin()).args(["run", "--iface", B_IF, "--metrics", "off"]).args(pin_args).output();
    let err = stderr(&o.unwrap());
    assert!(err.contains("in use by another running limiter daemon"), "{err}");
    let o = Command::new(bin()).args(["unload", "--pin-dir"]).arg(&dir).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("a running limiter daemon serves"), "{}", stderr(&o));
    assert!(dir.join("link").exists(), "a refused unload removed something");
    // Forced: the pins go; the daemon pins its link again.
    let o = Command::new(bin()).args(["unload", "--keep-maps", "--force", "--pin-dir"]).arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut log = String::new();
    wait_for(&d.log, "pinned the link again", Duration::from_secs(5), &mut log).unwrap();
    assert!(log.contains("NOT ENFORCING"), "the loss was not said: {log}");
    assert!(dir.join("link").exists());
    let s = status_json(&d);
    assert_eq!((s["attached"].as_bool(), s["reattaches"].as_u64()), (Some(true), Some(1)), "{s}");
    let m = scrape(&net);
    assert!(m.contains("limiter_reattaches_total 1"), "{m}");
    // Forced without --keep-maps: were the pin directory itself removed,
    // the daemon could pin nothing again, the interface would stay
    // unprotected and the next start would be refused (META missing).
    // The maps and directory stay; the daemon is back at once.
    let o = Command::new(bin()).args(["unload", "--force", "--pin-dir"]).arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("its maps stay"), "{}", stderr(&o));
    assert!(dir.join("META").exists() && dir.join("BUCKETS").exists(), "a live daemon's maps were removed");
    wait_for(&d.log, "pinned the link again", Duration::from_secs(5), &mut log).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) && !dir.join("link").exists() {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(dir.join("link").exists(), "the link was not pinned again");
    let s = status_json(&d);
    assert_eq!((s["attached"].as_bool(), s["reattaches"].as_u64()), (Some(true), Some(2)), "{s}");
    // And the next start over these pins works.
    drop(d);
    let again = start_in(&net.b, B_IF, "adpn3", &pin_args, |_| {});
    assert!(status_json(&again)["attached"].as_bool() == Some(true));
}

/// An interface that disappears is reported (status, metrics at 0)
/// and the program is attached again when it returns.
#[test]
fn a_lost_interface_is_reported_and_reattached() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adif");
    let d = start(&net, "adif", &[]);
    net.a.ip(&format!("link del {A_IF}"));
    let mut log = String::new();
    wait_for(&d.log, "NOT ENFORCING", Duration::from_secs(5), &mut log).unwrap();
    let s = status_json(&d);
    assert_eq!(s["attached"].as_bool(), Some(false), "{s}");
    let m = scrape(&net);
    assert!(m.contains(r#"limiter_attached{interface="vb",mode="native"} 0"#), "{m}");
    net.a.ip(&format!("link add {A_IF} type veth peer name {B_IF} netns {}", net.b.name));
    net.b.ip(&format!("link set {B_IF} up"));
    wait_for(&d.log, "attached to vb again", Duration::from_secs(5), &mut log).unwrap();
    let s = status_json(&d);
    assert_eq!((s["attached"].as_bool(), s["reattaches"].as_u64()), (Some(true), Some(1)), "{s}");
}

fn overrides(n: u32, duplicate_last: bool) -> String {
    use std::fmt::Write as _;
    let mut text = String::from("rate = 1000\nburst = 2000\n");
    for i in 0..n {
        let [_, a, b, c] = i.to_be_bytes();
        let _ = write!(text, "[[override]]\ncidr = \"{}.{b}.{c}.0/24\"\naction = \"deny\"\n", 100 + a);
    }
    if duplicate_last {
        text.push_str("[[override]]\ncidr = \"100.0.0.0/24\"\naction = \"deny\"\n");
    }
    text
}

/// Error location is linear; a long apply leaves status and
/// signals answered; files that never end are refused at once.
#[test]
fn quadratic_and_endless_policy_inputs_stay_bounded() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adq");
    let tmp = TempDir::new("adq");
    let dup = tmp.0.join("dup.toml");
    std::fs::write(&dup, overrides(131_071, true)).unwrap();
    let start = Instant::now();
    let o = Command::new(bin()).args(["policy", "check"]).arg(&dup).output().unwrap();
    let took = start.elapsed();
    let err = stderr(&o);
    println!("policy check, duplicate as the last of 131,072 overrides: {took:?}: {}", err.trim());
    assert!(err.contains(&format!("{}:{}: override[131071].cidr", dup.display(), 131_071 * 3 + 4)), "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}");

    // A FIFO and a device as the policy: refused at once.
    let fifo = tmp.0.join("fifo.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for bad in [fifo.as_path(), Path::new("/dev/zero")] {
        let start = Instant::now();
        let o = Command::new(bin()).args(["policy", "check"]).arg(bad).output().unwrap();
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    // A running daemon: 131,073 overrides refused quickly with the reason;
    // a valid 131,072 applied while status keeps answering.
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, "rate = 1000\nburst = 2000\n").unwrap();
    let d = start_in(&net.b, B_IF, "adq", &["--policy", policy.to_str().unwrap()], |_| {});
    let too_many = tmp.0.join("too_many.toml");
    std::fs::write(&too_many, overrides(131_073, false)).unwrap();
    let o = cli(&d.socket, &["policy", "apply", too_many.to_str().unwrap()]);
    assert!(stderr(&o).contains("131073 overrides, at most 131072 fit"), "{}", stderr(&o));
    let full = tmp.0.join("full.toml");
    std::fs::write(&full, overrides(131_072, false)).unwrap();
    let socket = d.socket.clone();
    let apply = std::thread::spawn(move || cli(&socket, &["policy", "apply", full.to_str().unwrap()]));
    let mut slowest = Duration::ZERO;
    let mut answered = 0;
    while !apply.is_finished() {
        let t = Instant::now();
        assert!(cli(&d.socket, &["status"]).status.success());
        slowest = slowest.max(t.elapsed());
        answered += 1;
    }
    let o = apply.join().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    println!("during a 131,072-override apply: {answered} status answers, slowest {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "status waited {slowest:?} behind an apply");
    // SIGHUP with the policy replaced by a FIFO: rejected, the daemon goes on.
    std::fs::remove_file(&policy).unwrap();
    std::os::unix::fs::symlink(&fifo, &policy).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(d.pid()).unwrap(), libc::SIGHUP) };
    let mut log = String::new();
    wait_for(&d.log, "not a regular file", Duration::from_secs(5), &mut log).unwrap();
    let s = status_json(&d);
    assert_eq!(s["policy_version"].as_u64(), Some(2), "{s}");
}

/// A truncated policy file on SIGHUP does not lift the operator's
/// denies: it is refused and the running policy stays.
#[test]
fn an_empty_policy_file_does_not_replace_the_running_one() {
    let _alone = limiter_tests::alone(module_path!());
    let net = VethPair::new("adem");
    let tmp = TempDir::new("adem");
    let policy = tmp.0.join("policy.toml");
    std::fs::write(&policy, "[[override]]\ncidr = \"198.18.1.0/24\"\naction = \"deny\"\n").unwrap();
    let d = start_in(&net.b, B_IF, "adem", &["--policy", policy.to_str().unwrap()], |_| {});
    std::fs::write(&policy, "").unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(i32::try_from(d.pid()).unwrap(), libc::SIGHUP) };
    let mut log = String::new();
    wait_for(&d.log, "rejected", Duration::from_secs(5), &mut log).unwrap();
    assert!(log.contains("allow_empty = true"), "{log}");
    let o = cli(&d.socket, &["prefix", "list", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["overrides"][0]["action"], "deny", "{j}");
    let o = Command::new(bin()).args(["policy", "check"]).arg(&policy).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    // Said explicitly, an empty policy is the built-in one.
    std::fs::write(&policy, "allow_empty = true\n").unwrap();
    assert!(Command::new(bin()).args(["policy", "check"]).arg(&policy).output().unwrap().status.success());
    // A policy that denies everything is valid but warned about.
    std::fs::write(&policy, "[[override]]\ncidr = \"0.0.0.0/0\"\naction = \"deny\"\n").unwrap();
    let o = Command::new(bin()).args(["policy", "check"]).arg(&policy).output().unwrap();
    assert!(
        o.status.success() && stderr(&o).contains("warning: override[0] denies every IPv4 source"),
        "{}",
        stderr(&o)
    );
}
