//! The capture path through the real program (BPF_PROG_TEST_RUN): with
//! `CAPTURE` off no frame is copied; on, every drop the draw takes is
//! copied into `CAPTURES` whole up to the snap length, with its reason,
//! class and length on the wire; a passed frame never is unless the
//! program's `LIMITER_PASSES` asks, and then one in N of them; one in N
//! copies about one drop in N.

use std::net::Ipv4Addr;

use limiter::{
    capture::Frame as Copied,
    dataplane::{Capture, DataPlane},
    policy::{CostUnit, Limit, Mode, Override, OverrideAction, Policy},
};
use limiter_common::{
    Reason,
    capture::{CaptureCtl, SNAP},
};
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

const T0: u64 = 9_000_000_000_000;

fn udp4(a: [u8; 4], payload: usize) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().payload(payload).bytes
}

fn open() -> (DataPlane, Capture) {
    let policy = Policy {
        default: Limit { rate: 1, burst: 1, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
        overrides: vec![Override {
            net: "198.18.44.0/24".parse().unwrap(),
            action: OverrideAction::Deny,
            criticality: None,
        }],
        ..Policy::default()
    };
    let c = policy.compile(1).unwrap();
    let mut l = kernel::open(&c);
    l.maps.apply(&c).unwrap();
    let capture = l.take_capture().expect("the object has the capture ring");
    (l, capture)
}

fn switch(c: &mut Capture, one_in: u32) {
    c.ctl.set(0, CaptureCtl { one_in, ..CaptureCtl::default() }, 0).unwrap();
}

fn copied(c: &mut Capture) -> Vec<Copied> {
    std::iter::from_fn(|| c.frames.next().map(|r| Copied::decode(&r, 0).expect("a whole record"))).collect()
}

#[test]
fn drops_are_copied_only_while_capture_is_on_and_passes_never() {
    let _alone = limiter_tests::alone(module_path!());
    let (mut l, mut c) = open();
    let (denied, limited) = (udp4([198, 18, 44, 1], 20), udp4([198, 18, 41, 1], 1_000));
    // Off: drops leave nothing.
    for _ in 0..10 {
        assert_eq!(kernel::reason_at(&mut l, T0, &denied), Reason::Denied);
    }
    assert!(copied(&mut c).is_empty());
    // On, every drop: each copied with what the program said of it.
    switch(&mut c, 1);
    assert_eq!(kernel::reason_at(&mut l, T0, &limited), Reason::Admitted, "the bucket's one packet");
    assert_eq!(kernel::reason_at(&mut l, T0, &limited), Reason::RateLimited);
    assert_eq!(kernel::reason_at(&mut l, T0, &denied), Reason::Denied);
    let got = copied(&mut c);
    assert_eq!(got.len(), 2, "the admitted frame is not copied");
    assert_eq!((got[0].reason, got[0].class, got[0].len as usize), (Reason::RateLimited, 0, limited.len()));
    assert_eq!(got[0].data, limited[..SNAP], "cut at the snap length");
    assert_eq!((got[1].reason, got[1].data.as_slice()), (Reason::Denied, denied.as_slice()), "whole");
    assert_eq!(got[1].source_ip(), Some("198.18.44.1".parse().unwrap()));
    assert!(got.iter().all(|f| f.one_in == 1));
    // One in 8: about an eighth of 800 drops.
    switch(&mut c, 8);
    for i in 0..800u64 {
        kernel::run_at(&mut l, T0 + i * 1_000, &denied);
    }
    let n = copied(&mut c).len();
    println!("one in 8: {n} of 800 drops copied");
    assert!((50..=150).contains(&n), "{n} of 800");
    switch(&mut c, 0);
    kernel::run_at(&mut l, T0, &denied);
    assert!(copied(&mut c).is_empty());
}

#[test]
fn passes_are_copied_only_while_the_global_asks_one_in_n_at_random() {
    let _alone = limiter_tests::alone(module_path!());
    let (mut l, mut c) = open();
    // 198.18.45/24 through an allow override: every packet passes.
    let allowed = |i: u8| udp4([198, 18, 45, i], 40);
    let mut policy_allowing = Policy {
        default: Limit { rate: 1, burst: 1, cost: CostUnit::Packets, mode: Mode::Enforce, window: None },
        ..Policy::default()
    };
    policy_allowing.overrides.push(Override {
        net: "198.18.45.0/24".parse().unwrap(),
        action: OverrideAction::Allow,
        criticality: None,
    });
    let compiled = policy_allowing.compile(2).unwrap();
    l.maps.apply(&compiled).unwrap();
    let first = kernel::reason_at(&mut l, T0, &allowed(1));
    assert_eq!(first.verdict(), limiter_common::Verdict::Pass, "{first:?}");
    // Capture of drops on, of passes off: no pass copied.
    switch(&mut c, 1);
    for i in 0..50 {
        kernel::run_at(&mut l, T0 + u64::from(i), &allowed(i));
    }
    assert!(copied(&mut c).is_empty(), "passes copied without being asked");
    switch(&mut c, 0);
    // Every pass.
    c.passes.set(0, 1, 0).unwrap();
    for i in 0..50 {
        kernel::run_at(&mut l, T0 + u64::from(i), &allowed(i));
    }
    let got = copied(&mut c);
    assert_eq!(got.len(), 50);
    assert!(got.iter().all(|f| f.reason == first && f.one_in == 1 && f.passed()));
    assert_eq!(got[7].data, allowed(7), "whole, with its source");
    // One in 8 of 800: about 100, each saying it stands for 8.
    c.passes.set(0, 8, 0).unwrap();
    for i in 0..800u64 {
        kernel::run_at(&mut l, T0 + i * 1_000, &allowed(1));
    }
    let got = copied(&mut c);
    println!("one in 8: {} of 800 passes copied", got.len());
    assert!((50..=150).contains(&got.len()), "{} of 800", got.len());
    assert!(got.iter().all(|f| f.one_in == 8));
    c.passes.set(0, 0, 0).unwrap();
    kernel::run_at(&mut l, T0, &allowed(1));
    assert!(copied(&mut c).is_empty());
}
