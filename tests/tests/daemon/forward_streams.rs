//! The forwarder's streams: long transfers by splice and by buffer over
//! IPv4 and IPv6, and the hardening findings (clients that stop reading,
//! an upstream back from an outage, running out of descriptors). The
//! test bed is `limiter_tests::forward`.

use std::{
    io::Write as _,
    net::{TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::forward::*;

/// Both ways of copying (`splice(2)` and a user-space buffer) move 8 MiB
/// each way intact, pass the client's half-close on, and carry the
/// connection's end back; one forwarder listens on IPv6 and the PROXY
/// header gives the client's IPv6 address.
#[test]
fn long_transfers_arrive_intact_by_splice_and_by_buffer_over_ipv4_and_ipv6() {
    let _alone = limiter_tests::alone(module_path!());
    let forwards = format!(
        "[[forward]]\nname = \"spliced\"\nlisten = [\"{FRONT}:8443\", \"[{FRONT6}]:8443\"]\nupstreams = [\"127.0.0.1:9110\"]\ncopy = \"splice\"\n\n[[forward]]\nname = \"buffered\"\nlisten = [\"{FRONT}:8444\"]\nupstreams = [\"127.0.0.1:9110\"]\ncopy = \"buffer\"\n"
    );
    let s = setup("fwcp", &forwards);
    let (tx, rx) = std::sync::mpsc::channel();
    let up = echo_upstream(&s.net.b, 9110, tx);
    thread::sleep(Duration::from_millis(200));
    let len = 8 << 20;
    let v4: std::net::SocketAddr = format!("{FRONT}:8443").parse().unwrap();
    let v6: std::net::SocketAddr = format!("[{FRONT6}]:8443").parse().unwrap();
    let buffered: std::net::SocketAddr = format!("{FRONT}:8444").parse().unwrap();
    for to in [v4, v6, buffered] {
        assert!(echo_round_trip(&s.net.a, to, len), "8 MiB through {to} did not come back intact");
        let src = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let want = if to.is_ipv6() { format!("[{CLIENT6}]:") } else { format!("{CLIENT}:") };
        assert!(src.starts_with(&want), "through {to}: the PROXY header says {src}, want {want}...");
    }
    up.join().unwrap();
    let j = status(&s);
    let bytes: u64 = (0..2).map(|i| j["forwards"][i]["bytes_up"].as_u64().unwrap_or(0)).sum();
    assert!(bytes >= 3 * len as u64, "bytes counted up: {bytes}\n{j}");
}

/// Clients that never read a bulk download must not stay open past
/// `idle_timeout` (about 4 MB of socket memory each), in both copy
/// modes: a direction that cannot drain for the idle timeout ends the
/// connection.
#[test]
fn clients_that_stop_reading_are_closed_after_the_idle_timeout() {
    let _alone = limiter_tests::alone(module_path!());
    for (tag, copy) in [("fwsr", "buffer"), ("fwss", "splice")] {
        let s = setup(tag, &forward(8443, &[9120], &format!("idle_timeout = \"2s\"\ncopy = \"{copy}\"")));
        let listener = s.net.b.run_in(|| TcpListener::bind("127.0.0.1:9120").unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        // The upstream: a bulk download to whoever connects, until the
        // connection ends (bounded in time).
        let up = thread::spawn(move || {
            listener.set_nonblocking(true).unwrap();
            let mut writers = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut c, _)) => {
                        let stop = Arc::clone(&stop2);
                        writers.push(thread::spawn(move || {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_write_timeout(Some(Duration::from_millis(200)));
                            let chunk = vec![0x5a; 64 << 10];
                            let until = Instant::now() + Duration::from_secs(30);
                            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                                match c.write(&chunk) {
                                    Ok(_) => {}
                                    Err(e)
                                        if e.kind() == std::io::ErrorKind::WouldBlock
                                            || e.kind() == std::io::ErrorKind::TimedOut => {}
                                    Err(_) => break,
                                }
                            }
                        }));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
            for w in writers {
                let _ = w.join();
            }
        });
        wait_listening(&s.net.b, 9120);
        // Ten clients that connect and never read.
        let clients: Vec<TcpStream> =
            (0..10).map(|_| s.net.a.run_in(|| TcpStream::connect((FRONT, 8443)).unwrap())).collect();
        thread::sleep(Duration::from_millis(500));
        let active = |s: &Setup| status(s)["forwards"][0]["active"].as_u64().unwrap();
        assert_eq!(active(&s), 10, "{copy}: the clients are connected");
        let start = Instant::now();
        while active(&s) > 0 && start.elapsed() < Duration::from_secs(8) {
            thread::sleep(Duration::from_millis(200));
        }
        let left = active(&s);
        println!(
            "{copy}: 10 clients that never read closed {:?} after the stall began (idle_timeout 2 s)",
            start.elapsed()
        );
        assert_eq!(left, 0, "{copy}: {left} stalled connections still open after {:?}", start.elapsed());
        stop.store(true, Ordering::Relaxed);
        drop(clients);
        up.join().unwrap();
    }
}

/// The only upstream out for 3 s while 40 clients connect: were every
/// concurrent failure to double the back-off, it would reach 30 s, every
/// connection would be shed `no_upstream` for 30 s after the upstream was
/// healthy again, with a WARN line each. The back-off doubles once per failure episode, one probe at a time
/// goes through, and the warnings are rate-limited with a count.
#[test]
fn an_upstream_back_from_an_outage_serves_within_seconds() {
    let _alone = limiter_tests::alone(module_path!());
    let s = setup("fwbo", &forward(8443, &[9121], ""));
    // No upstream yet: 40 clients connect within the outage.
    let failed: usize = thread::scope(|sc| {
        let handles: Vec<_> = (0..40).map(|_| sc.spawn(|| !request(&s.net.a, 8443, "").contains("\"port\""))).collect();
        handles.into_iter().map(|h| usize::from(h.join().unwrap())).sum()
    });
    assert_eq!(failed, 40, "nothing serves yet");
    thread::sleep(Duration::from_secs(2));
    // The upstream comes up.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let up = tlv_upstream(&s.net.b, 9121, Duration::ZERO, Arc::clone(&stop), Arc::clone(&served));
    let back = Instant::now();
    while served.load(Ordering::Relaxed) == 0 && back.elapsed() < Duration::from_secs(15) {
        let _ = request(&s.net.a, 8443, "");
        thread::sleep(Duration::from_millis(100));
    }
    let took = back.elapsed();
    println!("an upstream out while 40 clients connected served again {took:?} after it came back");
    assert!(served.load(Ordering::Relaxed) > 0 && took < Duration::from_secs(5), "served again only after {took:?}");
    let log: Vec<String> = s.log.try_iter().filter(|l| l.contains("upstream 127.0.0.1:9121 failed")).collect();
    assert!(log.len() <= 3, "{} warnings for one outage: {log:?}", log.len());
    stop.store(true, Ordering::Relaxed);
    up.join().unwrap();
}

/// Under `ulimit -n 256` the forwarder must not blame its own EMFILE on
/// the healthy upstream (`upstream_failed`, `no_upstream`) nor keep
/// shedding after descriptors are free again; nor may the forwarded
/// connections take every descriptor so that the control socket cannot
/// accept `limiter status` for 30 s. The forwarders hold at most what the limit leaves after
/// a reserve for the control socket, `/metrics` and feedback, shed the
/// rest at accept (`descriptors`), never blame the upstream, and the
/// operator's `status` answers throughout.
#[test]
fn running_out_of_descriptors_never_blames_the_upstream() {
    let _alone = limiter_tests::alone(module_path!());
    use std::os::unix::process::CommandExt as _;
    let s = setup_with("fwmf", &forward(8443, &[9122], ""), |c| unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 512, rlim_max: 512 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    });
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let up = tlv_upstream(&s.net.b, 9122, Duration::from_secs(3), Arc::clone(&stop), Arc::clone(&served));
    wait_listening(&s.net.b, 9122);
    // 300 clients hold their connections: six descriptors each in the
    // daemon (spliced), far more than its 512.
    let held: Vec<TcpStream> =
        s.net.a.run_in(|| (0..300).filter_map(|_| TcpStream::connect((FRONT, 8443)).ok()).collect());
    thread::sleep(Duration::from_secs(2));
    // The operator asks while the forwarders hold all they may.
    let asked = std::time::Instant::now();
    let during = status(&s)["forwards"][0].clone();
    let answered = asked.elapsed();
    let log: Vec<String> = s.log.try_iter().filter(|l| l.contains("descriptor")).collect();
    drop(held);
    // The upstream lets its connections go after its 3 s hold; the
    // clients' connections still queued when they left are accepted as
    // descriptors free up, and each holds the upstream 3 s too (a slow
    // machine drains that queue later): wait, bounded, until none is
    // open, so that descriptors are free again.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while status(&s)["forwards"][0]["active"].as_u64() != Some(0) && std::time::Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    let answer = request(&s.net.a, 8443, "");
    let after = status(&s)["forwards"][0].clone();
    let shed_for = |j: &serde_json::Value, why: &str| {
        j["shed"].as_array().unwrap().iter().find(|p| p[0] == why).and_then(|p| p[1].as_u64()).unwrap()
    };
    println!(
        "300 held connections over 512 descriptors: {} open while held, status answered in {answered:?}, {} shed for descriptors, {} served upstream, local_errors {}, upstream_connect_failures {}, upstream_failed {}; the next request served",
        during["active"],
        shed_for(&after, "descriptors"),
        served.load(Ordering::Relaxed),
        after["local_errors"],
        after["upstream_connect_failures"],
        after["upstream_failed"]
    );
    assert!(answered < Duration::from_secs(5), "status took {answered:?} while the forwarder was full");
    assert!(during["active"].as_u64().unwrap() > 0, "nothing forwarded: {during}");
    assert!(shed_for(&during, "descriptors") > 0, "the descriptor budget never acted: {during}");
    assert!(log.iter().any(|l| l.contains("LimitNOFILE")), "no word to the operator: {log:?}");
    assert_eq!(shed_for(&during, "max_connections"), 0, "{during}");
    assert!(answer.contains("\"port\""), "the next connection was not served: {answer:?} ({after})");
    assert_eq!(after["upstream_connect_failures"].as_u64(), Some(0), "{after}");
    assert_eq!(after["upstream_failed"].as_u64(), Some(0), "{after}");
    assert!(after["upstreams"].as_array().unwrap().iter().all(|u| u[1] == true), "{after}");
    stop.store(true, Ordering::Relaxed);
    up.join().unwrap();
}
