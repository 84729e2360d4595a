//! The out-of-state check with the PROXY v2 forwarder: the policy judges
//! out-of-state TCP from the start (`tcp_state = "always"`), the
//! forwarder listens on the guarded interface, and its upstream sits
//! across that interface too, so both of the forwarder's legs (the
//! connections it accepts and the ones it opens) cross the check. During
//! a spoofed flood of ACKs, RSTs, FINs and data segments at the
//! forwarder's own port, long transfers through it arrive intact over
//! IPv4 and IPv6, and the flood is dropped at the driver: the DUT's
//! kernel answers almost none of it.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    forward::{CLIENT, FRONT, FRONT6, echo_round_trip, echo_upstream_at, setup_policy},
    scenario,
};

/// How long the flood runs: the transfers must end inside it.
const FLOOD_SECS: u64 = 8;
/// Each transfer's bytes, each way.
const LEN: usize = 4 << 20;

#[test]
fn the_forwarders_connections_pass_the_check_while_a_flood_at_its_port_is_dropped() {
    let _alone = limiter_tests::alone(module_path!());
    let upstream: SocketAddr = format!("{CLIENT}:9130").parse().unwrap();
    let policy = format!(
        "rate = 100000\nburst = 100000\ntcp_state = \"always\"\n\n[[forward]]\nname = \"front\"\nlisten = \
         [\"{FRONT}:8443\", \"[{FRONT6}]:8443\"]\nupstreams = [\"{upstream}\"]\n"
    );
    let s = setup_policy("tsfw", &policy, |_| {});
    let status = String::from_utf8_lossy(&scenario::cli(&s.socket, &["status"]).stdout).into_owned();
    assert!(status.contains("judging out-of-state TCP in class default"), "{status}");
    // The upstream in the client's namespace: the forwarder reaches it
    // through the guarded interface, and its answers come back through
    // the check.
    let (tx, rx) = std::sync::mpsc::channel();
    let up = echo_upstream_at(&s.net.a, upstream, 6, tx);
    thread::sleep(Duration::from_millis(200));

    let v4: SocketAddr = format!("{FRONT}:8443").parse().unwrap();
    let v6: SocketAddr = format!("[{FRONT6}]:8443").parse().unwrap();
    let transfers = || {
        let start = Instant::now();
        for to in [v4, v6, v4] {
            assert!(echo_round_trip(&s.net.a, to, LEN), "{LEN} B through {to} did not come back intact");
        }
        start.elapsed()
    };
    let quiet = transfers();

    let rsts = s.net.b.nstat("TcpOutRsts");
    let (sent, took) = thread::scope(|scope| {
        let flood = scope.spawn(|| scenario::spoof_tcp(&s.net, 8443, &FLOOD_SECS.to_string(), "mixed", None));
        thread::sleep(Duration::from_millis(500));
        let took = transfers();
        (flood.join().unwrap(), took)
    });
    let rsts = s.net.b.nstat("TcpOutRsts") - rsts;
    up.join().unwrap();
    let sources: Vec<String> = rx.try_iter().collect();
    let dropped = scenario::reason_packets(&s.socket, "tcp_out_of_state");
    let j = limiter_tests::forward::status(&s);
    let up_bytes = j["forwards"][0]["bytes_up"].as_u64().unwrap_or(0);
    println!(
        "3 transfers of {LEN} B each way through the forwarder: {quiet:?} without a flood, {took:?} during a flood of {sent} segments at its \
         port: the DUT's kernel sent {rsts} RSTs, the check dropped {dropped}; {up_bytes} B forwarded up; PROXY \
         sources {sources:?}"
    );
    assert!(took < Duration::from_secs(FLOOD_SECS - 1), "the transfers outlasted the flood ({took:?})");
    assert_eq!(sources.len(), 6, "{sources:?}");
    assert!(sources.iter().all(|src| src.contains(CLIENT) || src.contains("2001:2::10")), "{sources:?}");
    assert!(up_bytes >= 6 * LEN as u64, "{j}");
    // Every segment of the flood and none of the forwarder's own.
    assert!(dropped as f64 >= 0.9 * sent as f64, "{dropped} of {sent} dropped as out of state");
    assert!(dropped <= sent, "{dropped} dropped as out of state, more than the flood's {sent}");
    assert!(rsts as f64 <= 0.01 * sent as f64, "{rsts} RSTs for {sent} segments");
}
