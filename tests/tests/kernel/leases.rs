//! Per-CPU leases through the real program, each packet run on a chosen
//! CPU (BPF_PROG_TEST_RUN runs on the caller's CPU) at an injected time:
//! a lease is charged to the bucket once and spent on its CPU without
//! touching the bucket, another CPU's lease never refuses a conforming
//! packet, and two CPUs together stay within burst + rate x T + 2 x lease.

use std::net::Ipv4Addr;

use limiter_common::{Reason, gcra};
use limiter_tests::{
    kernel::{self, pin_to_cpu, reason_at, require_root, v4_key},
    packet::*,
};

const T0: u64 = 1_000_000_000_000;
const RATE: u64 = 1000;
const BURST: u64 = 200;

fn two_cpus() {
    require_root();
    let n = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(n >= 2, "these tests need two CPUs; this machine has {n}");
}

fn frame(host: u8) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 20, host), IPPROTO_UDP, 0, 0).udp().bytes
}

fn tat(l: &limiter::dataplane::DataPlane) -> u64 {
    l.bucket(&v4_key([198, 18, 20, 0], 24)).unwrap().expect("bucket tracked").tat
}

#[test]
fn a_lease_is_spent_on_its_cpu_and_another_cpus_conforming_burst_takes_it_back() {
    let _alone = limiter_tests::alone(module_path!());
    two_cpus();
    let mut l = kernel::open(&kernel::config(RATE, BURST, false, 24, 56));
    let unit = gcra::unit_interval(RATE);
    pin_to_cpu(0);
    // The first packet creates the bucket; the second is charged to it
    // (and this CPU notes the prefix); the third takes a lease: more than
    // its own cost, at most 1/16 of the burst.
    assert_eq!(reason_at(&mut l, T0, &frame(1)), Reason::Admitted);
    let first = tat(&l);
    assert_eq!(reason_at(&mut l, T0, &frame(1)), Reason::Admitted);
    let before = tat(&l);
    assert_eq!(before - first, unit, "the second packet took a lease");
    assert_eq!(reason_at(&mut l, T0, &frame(1)), Reason::Admitted);
    let leased = tat(&l) - before - unit;
    assert!(leased >= 2 * unit && leased <= BURST * unit / 16, "lease of {leased} (unit {unit})");
    // Spent on this CPU without touching the bucket.
    let in_lease = leased / unit;
    for i in 0..in_lease {
        assert_eq!(reason_at(&mut l, T0, &frame(1)), Reason::Admitted, "packet {i} of the lease");
    }
    assert_eq!(tat(&l), before + unit + leased, "packets of the lease charged the bucket again");
    let on_cpu0 = 3 + in_lease;
    // Another lease on CPU 0, then CPU 1 sends the rest of the burst at
    // the same instant: every one of them conforms, and is admitted.
    assert_eq!(reason_at(&mut l, T0, &frame(2)), Reason::Admitted);
    let on_cpu0 = on_cpu0 + 1;
    pin_to_cpu(1);
    for i in 0..BURST - on_cpu0 {
        assert_eq!(reason_at(&mut l, T0, &frame(3)), Reason::Admitted, "conforming packet {i} on CPU 1");
    }
    // The burst is spent, exactly: CPU 1 is refused, and CPU 0's lease
    // was taken back, so it is refused too.
    assert_eq!(reason_at(&mut l, T0, &frame(3)), Reason::RateLimited);
    pin_to_cpu(0);
    assert_eq!(reason_at(&mut l, T0, &frame(1)), Reason::RateLimited);
    // One unit of refill later, one packet, from either CPU.
    assert_eq!(reason_at(&mut l, T0 + 1_000_000, &frame(1)), Reason::Admitted);
    assert_eq!(reason_at(&mut l, T0 + 1_000_000, &frame(1)), Reason::RateLimited);
}

#[test]
fn two_cpus_together_get_the_burst_exactly_then_stay_within_the_lease_bound() {
    let _alone = limiter_tests::alone(module_path!());
    two_cpus();
    let mut l = kernel::open(&kernel::config(RATE, BURST, false, 24, 56));
    // Both CPUs send to the /24 in turns of 7 packets: 300 packets at one
    // instant, then 10 packets a millisecond (10x the rate) for 1 s.
    let mut admitted = Vec::new();
    let times = (0..300).map(|_| T0).chain((0..10_000u64).map(|i| T0 + 1_000_000 + i * 100_000));
    for (n, t) in times.enumerate() {
        if n % 7 == 0 {
            pin_to_cpu((n / 7) % 2);
        }
        if reason_at(&mut l, t, &frame(9)) == Reason::Admitted {
            admitted.push(t);
        }
    }
    // At one instant: the burst exactly, though both CPUs held leases on
    // the way.
    let first = admitted.iter().filter(|t| **t == T0).count() as u64;
    assert_eq!(first, BURST, "admitted at one instant");
    // Any window: at most burst + rate x W + 2 CPUs x a lease (1/16 of the
    // burst), and over the whole run the rate was delivered.
    let lease = BURST.div_ceil(16);
    for w_ms in [1u64, 10, 100, 1000] {
        let w = w_ms * 1_000_000;
        let busiest = (0..admitted.len())
            .map(|i| admitted[i..].iter().take_while(|t| **t < admitted[i] + w).count() as u64)
            .max()
            .unwrap();
        let bound = BURST + RATE * w_ms / 1000 + 2 * lease;
        assert!(busiest <= bound, "{busiest} admitted in {w_ms} ms > {bound}");
    }
    let total = admitted.len() as u64;
    assert!(total >= BURST + RATE - 2, "only {total} admitted in 1 s");
}
