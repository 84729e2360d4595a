//! `limiter replay` over a generated capture: totals per prefix, worked
//! out by hand from the token-bucket rules for rate 10/s, burst 5.

use std::{net::Ipv4Addr, path::Path, process::Command};

use limiter_tests::{
    kernel::require_root,
    packet::{ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, Frame, IPPROTO_UDP},
    scenario,
};

fn write_pcap(path: &Path, frames: &[(u64, Vec<u8>)]) {
    let mut b = Vec::new();
    for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65_535, 1] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    for (t_us, data) in frames {
        let len = u32::try_from(data.len()).unwrap();
        for w in [u32::try_from(t_us / 1_000_000).unwrap(), u32::try_from(t_us % 1_000_000).unwrap(), len, len] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(data);
    }
    std::fs::write(path, b).unwrap();
}

fn udp4(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().bytes
}

fn udp6(a: &str) -> Vec<u8> {
    Frame::eth(ETH_P_IPV6).ipv6(a.parse().unwrap(), IPPROTO_UDP).udp().bytes
}

fn capture() -> Vec<(u64, Vec<u8>)> {
    let t0 = 1_700_000_000_000_000u64; // an ordinary wall-clock capture time, in µs
    let mut f = Vec::new();
    f.extend((0..20).map(|_| (t0, udp4([198, 18, 40, 1]))));
    f.extend((0..3).map(|_| (t0, udp4([198, 18, 41, 1]))));
    f.extend((0..4).map(|_| (t0, udp6("2001:2:0:100::1"))));
    f.extend((0..4).map(|_| (t0, udp6("2001:2:0:1ff::2"))));
    f.push((t0, Frame::eth(ETH_P_ARP).payload(28).bytes));
    f.push((t0, vec![0u8; 10])); // a runt: shorter than an Ethernet header
    f.extend((1..=10).map(|s| (t0 + s * 1_000_000, udp4([198, 18, 40, 1]))));
    f.push((t0 + 10_500_000, udp4([198, 18, 40, 77])));
    f
}

fn replay(pcap: &Path, policy: &Path) -> serde_json::Value {
    let o = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["replay", "--json", "--pcap"])
        .arg(pcap)
        .arg("--policy")
        .arg(policy)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn row(j: &serde_json::Value, prefix: &str) -> [u64; 4] {
    let r = j["prefixes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["prefix"] == prefix)
        .unwrap_or_else(|| panic!("{prefix}: {j}"));
    ["packets", "passed", "dropped", "shadow_dropped"].map(|k| r[k].as_u64().unwrap())
}

#[test]
fn replay_of_a_generated_capture_gives_the_expected_totals() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = limiter_tests::kernel::TempDir::new("replay");
    let dir = &tmp.0;
    let pcap = dir.join("t.pcap");
    write_pcap(&pcap, &capture());
    let enforce = dir.join("enforce.toml");
    std::fs::write(&enforce, "rate = 10\nburst = 5\n").unwrap();
    let shadow = dir.join("shadow.toml");
    std::fs::write(&shadow, "mode = \"shadow\"\nrate = 10\nburst = 5\n").unwrap();

    let j = replay(&pcap, &enforce);
    assert_eq!(j["frames"].as_u64(), Some(44));
    // 198.18.40.0/24: 5 of the 20 at t0; then one a second for 10 s, each
    // finding a refilled bucket; and .77 at t0+10.5 s (same /24) too.
    assert_eq!(row(&j, "198.18.40.0/24"), [31, 16, 15, 0]);
    assert_eq!(row(&j, "198.18.41.0/24"), [3, 3, 0, 0]);
    // Two addresses in one /56 share a burst of 5.
    assert_eq!(row(&j, "2001:2:0:100::/56"), [8, 5, 3, 0]);
    assert_eq!(row(&j, "non-ip"), [1, 1, 0, 0]);
    assert_eq!(row(&j, "malformed"), [1, 0, 1, 0]);
    assert_eq!(j["prefixes"][0]["prefix"], "198.18.40.0/24", "sorted by drops");

    // Shadow mode on the same capture: what enforce dropped, shadow counts.
    let j = replay(&pcap, &shadow);
    assert_eq!(row(&j, "198.18.40.0/24"), [31, 31, 0, 15]);
    assert_eq!(row(&j, "2001:2:0:100::/56"), [8, 8, 0, 3]);

    // Human form, and a file that is not a capture.
    let bin = scenario::locate_bin("limiter").unwrap();
    let o = Command::new(&bin).args(["replay", "--pcap"]).arg(&pcap).arg("--policy").arg(&enforce).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("prefix") && out.contains("198.18.40.0/24"), "{out}");
    let o = Command::new(&bin).args(["replay", "--pcap"]).arg(&enforce).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.lines().count() == 1 && err.contains("neither pcap nor pcapng"), "{err}");
}

/// A frame cut by the capture's snap length is charged its
/// original length, and a frame stamped earlier than the one before is
/// replayed at that one's time (said in the report), not as time zero.
#[test]
fn replay_charges_original_lengths_and_never_runs_time_back() {
    let _alone = limiter_tests::alone(module_path!());
    require_root();
    let tmp = limiter_tests::kernel::TempDir::new("replay-len");
    let dir = &tmp.0;
    // 1,500-byte frames captured at 64 bytes; byte cost, 3,000 bytes of
    // burst, 1 byte a second: the first two fit, the third does not.
    let whole = Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::new(198, 18, 50, 1), IPPROTO_UDP, 0, 0).udp().payload(1458).bytes;
    assert_eq!(whole.len(), 1500);
    let cut = whole[..64].to_vec();
    let mut b = Vec::new();
    for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 64, 1] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    for sec in [10u32, 11, 12] {
        for w in [sec, 0, 64, 1500] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&cut);
    }
    let pcap = dir.join("cut.pcap");
    std::fs::write(&pcap, &b).unwrap();
    let bytes = dir.join("bytes.toml");
    std::fs::write(&bytes, "cost = \"bytes\"\nrate = 1\nburst = 3000\n").unwrap();
    let j = replay(&pcap, &bytes);
    assert_eq!(row(&j, "198.18.50.0/24"), [3, 2, 1, 0], "{j}");

    // Out of order, as captures from several queues interleave: 6 packets
    // stamped t0+10 s come first in the file, then two stamped t0 and
    // t0+5 s. Put back in order, the early two pass and leave the bucket
    // refilled by t0+10 s: 5 of the 6 pass. (Clamped to one instant, all
    // eight would meet one burst of 5.)
    let t0 = 1_700_000_000_000_000u64;
    let mut frames: Vec<(u64, Vec<u8>)> = (0..6).map(|_| (t0 + 10_000_000, udp4([198, 18, 51, 1]))).collect();
    frames.push((t0, udp4([198, 18, 51, 1])));
    frames.push((t0 + 5_000_000, udp4([198, 18, 51, 1])));
    let pcap = dir.join("reordered.pcap");
    write_pcap(&pcap, &frames);
    let enforce = dir.join("enforce.toml");
    std::fs::write(&enforce, "rate = 1\nburst = 5\n").unwrap();
    let j = replay(&pcap, &enforce);
    assert_eq!((j["reordered"].as_u64(), j["late"].as_u64()), (Some(2), Some(0)), "{j}");
    assert_eq!(row(&j, "198.18.51.0/24"), [8, 7, 1, 0], "{j}");
}

/// `replay` numbers window slices from the capture's clock, not its own
/// (which would give 1820 for the seed's uniform pattern where the live
/// program gives 1800): a capture
/// written at a multiple of the slice gives the seed's row, and one
/// shifted by a fraction of a slice gives what the live program gives at
/// those very times.
#[test]
fn window_quotas_replay_on_the_captures_own_clock() {
    let _alone = limiter_tests::alone(module_path!());
    use limiter::policy::Scope;
    use limiter_tests::kernel;

    require_root();
    let tmp = limiter_tests::kernel::TempDir::new("rpwin");
    let policy = tmp.0.join("policy.toml");
    std::fs::write(
        &policy,
        "rate = 1000000\nburst = 1000000\n\n[[class]]\nname = \"quota\"\nprotocol = \"udp\"\nlimit = 600\nwindow = \"60s\"\nslices = 12\n",
    )
    .unwrap();
    let pcap = tmp.0.join("seed.pcap");
    let frame = udp4([198, 18, 10, 1]);
    // A Unix time that is a multiple of the 5 s slice, in µs.
    let t0_us = 1_700_000_000_000_000u64;
    for (name, times, seed_row) in limiter_tests::study::patterns() {
        for shift_us in [0u64, 2_500_000] {
            let frames: Vec<(u64, Vec<u8>)> =
                times.iter().map(|t| (t0_us + shift_us + t * 1_000, frame.clone())).collect();
            write_pcap(&pcap, &frames);
            let passed = row(&replay(&pcap, &policy), "198.18.10.0/24")[1];
            // The live program at those times: its slices on that clock.
            let mut live = kernel::open(&kernel::window_config(600, 60_000, 12, Scope::Local));
            let live_passed = frames
                .iter()
                .filter(|(t_us, f)| {
                    live.set_test_clock(t_us * 1_000).unwrap();
                    live.test_run(limiter_common::programs::LIMITER_TEST_CLOCK, f, 1).unwrap().0 == kernel::XDP_PASS
                })
                .count() as u64;
            println!(
                "{name}, shifted {shift_us} us: replay {passed}, live program {live_passed} (seed's row {seed_row})"
            );
            assert_eq!(passed, live_passed, "{name} shifted {shift_us} us");
            if shift_us == 0 {
                assert_eq!(passed, seed_row, "{name}: the seed's row");
            }
        }
    }
}
