//! The new-source budget: prefixes without a bucket draw on one shared
//! budget; beyond it they are dropped without a bucket being created, and
//! prefixes that already have one are not affected.
#![allow(clippy::cast_precision_loss, reason = "test measurements: counts far inside f64's exact range")]

use std::{net::Ipv4Addr, process::Stdio, thread, time::Duration};

use limiter::policy::{CostUnit, Limit, Mode, Policy};
use limiter_common::Reason;
use limiter_tests::{
    kernel::{self, require_root},
    netns::{B_ADDR, B_IF, VethPair},
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
    scenario::{self, CONFORM_SRC, PORT, field, spawn_lines, unique_socket, wait_for},
};

const T0: u64 = 7_000_000_000_000;

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

fn reason(l: &mut limiter::dataplane::DataPlane, now: u64, f: &[u8]) -> Reason {
    kernel::reason_at(l, now, f)
}

/// The built-in policy has the budget on: at one instant exactly its
/// burst of new prefixes gets a bucket; without it, every one does.
#[test]
fn the_built_in_policy_has_a_new_source_budget() {
    let _alone = limiter_tests::alone(module_path!());
    let (_, burst) = limiter::policy::DEFAULT_NEW_SOURCES;
    let burst = usize::try_from(burst).unwrap();
    let addr = |i: usize| {
        let [_, _, hi, lo] = u32::try_from(i).unwrap().to_be_bytes();
        [198, 18, hi, lo]
    };
    let mut p = Policy { v4_prefix: 32, ..Policy::default() };
    for (budget, want) in [(true, burst), (false, burst + 50)] {
        if !budget {
            p.new_sources = None;
        }
        // Room for every prefix (kernel::open's map holds 1,024).
        let mut l = kernel::open_with_capacity(&p.compile(1).unwrap(), 4 * 10_050);
        let admitted = (0..burst + 50).filter(|i| reason(&mut l, T0, &udp4(addr(*i))) == Reason::Admitted).count();
        assert_eq!(admitted, want, "budget {budget}");
        assert_eq!(l.tracked(), want, "budget {budget}");
    }
}

#[test]
fn new_prefixes_draw_on_a_shared_budget_and_old_ones_do_not() {
    let _alone = limiter_tests::alone(module_path!());
    let p = Policy {
        default: Limit { rate: 1, burst: 2, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
        new_sources: Some((10, 5)),
        ..Policy::default()
    };
    let mut l = kernel::open(&p.compile(1).unwrap());
    let got: Vec<Reason> = (0..20u8).map(|i| reason(&mut l, T0, &udp4([198, 18, 100 + i, 1]))).collect();
    assert_eq!(got.iter().filter(|r| **r == Reason::Admitted).count(), 5, "{got:?}");
    assert_eq!(got.iter().filter(|r| **r == Reason::NewSourceLimited).count(), 15, "{got:?}");
    // Refused sources got no bucket: only the five admitted are tracked.
    assert_eq!(l.tracked(), 5);
    // A prefix with a bucket is not affected while the budget is spent.
    assert_eq!(reason(&mut l, T0, &udp4([198, 18, 100, 9])), Reason::Admitted);
    assert_eq!(reason(&mut l, T0, &udp4([198, 18, 100, 9])), Reason::RateLimited);
    // 100 ms later the budget has one more new prefix in it (10/s).
    let later = T0 + 100_000_000;
    assert_eq!(reason(&mut l, later, &udp4([198, 18, 200, 1])), Reason::Admitted);
    assert_eq!(reason(&mut l, later, &udp4([198, 18, 201, 1])), Reason::NewSourceLimited);
}

#[test]
fn a_flood_of_100k_spoofed_sources_stays_within_the_budget() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let (rate, burst) = (2_000u64, 1_000u64);
    let net = VethPair::new("ns");
    net.add_source(CONFORM_SRC);
    let mut c = net.b.command(scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--status-interval", "0", "--metrics", "off", "--v4-prefix", "32"]);
    c.args(["--rate", "1000", "--burst", "200", "--capacity", "65536"]);
    c.args(["--new-source-rate", &rate.to_string(), "--new-source-burst", &burst.to_string()]);
    let socket = unique_socket("ns");
    c.arg("--socket").arg(&socket);
    let (_daemon, rx) = spawn_lines(c).unwrap();
    wait_for(&rx, "control socket", Duration::from_secs(20), &mut String::new()).unwrap();

    let netload = env!("CARGO_BIN_EXE_netload");
    let mut recv = net.b.command(netload);
    recv.args(["recv", &format!("0.0.0.0:{PORT}"), "6"]);
    let (mut recv, recv_rx) = spawn_lines(recv).unwrap();
    wait_for(&recv_rx, "ready", Duration::from_secs(10), &mut String::new()).unwrap();
    // The conforming sender's bucket exists before the flood starts.
    let dst = format!("{B_ADDR}:{PORT}");
    let conform =
        net.a.command(netload).args(["send", CONFORM_SRC, &dst, "400", "4"]).stdout(Stdio::piped()).spawn().unwrap();
    thread::sleep(Duration::from_millis(500));
    let mac = net.b_mac();
    let spoof = net.a.command(netload).args(["spoof", "va", &mac, &dst, "100000"]).output().unwrap();
    assert!(spoof.status.success(), "{}", String::from_utf8_lossy(&spoof.stderr));
    let spoof_out = String::from_utf8_lossy(&spoof.stdout).into_owned();
    let spoof_secs: f64 = spoof_out.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(field(&spoof_out, "sent", 1), Some(100_000));

    let conform_out = scenario::wait_output(scenario::Guard(conform)).unwrap();
    assert!(recv.0.wait().unwrap().success());
    let recv_log: String = recv_rx.iter().map(|l| l + "\n").collect();
    let conform_sent = field(&conform_out, "sent", 1).unwrap();
    let conform_got = field(&recv_log, &format!("from {CONFORM_SRC}"), 2).unwrap_or(0);
    let total = field(&recv_log, "total", 1).unwrap();
    let spoofed_got = total - conform_got;

    let o = std::process::Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["status", "-j", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tracked = status["tracked"].as_u64().unwrap();
    println!(
        "spoofed 100000 in {spoof_secs:.3} s: {spoofed_got} admitted; tracked {tracked}; conforming {conform_got}/{conform_sent}"
    );

    // Tolerance, at the budget's rate: the coarse clock (4 ms at HZ=250,
    // at both ends) and up to 10 ms of frames still queued in the veth ring
    // when the sender's own clock stopped.
    let bound = burst as f64 + rate as f64 * (spoof_secs + 0.018);
    assert!(spoofed_got as f64 <= bound, "admitted {spoofed_got} spoofed > budget {bound:.0}");
    assert!(spoofed_got >= burst, "the budget's burst was not used: {spoofed_got}");
    assert_eq!(conform_got, conform_sent, "the conforming sender lost packets; links:\n{}", net.link_counters());
    // Refused sources create no state: tracked stays near what was admitted.
    assert!(tracked <= spoofed_got + 4 && tracked <= 65_536, "tracked {tracked}");
}
