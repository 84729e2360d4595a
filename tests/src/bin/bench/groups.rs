//! `bench groups`: country and ASN groups. Per packet, beside the plain
//! admitted path and the deny set in the same rounds: an address in a
//! rate group, one in a denied group. Under the injected clock: a rate
//! group held under a flood nine times its rate spread over 1,000 of its
//! /24s, while a conforming client of another group loses nothing. On
//! real data (the ASN list's 500,000-odd IPv4 networks): how long loading
//! and replacing them takes, the longest single kernel call and the
//! longest any other CPU waited meanwhile, and the memory per network.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use limiter::dataplane::{DataPlane, deny::DenySet, groups::GroupWrites};
use limiter_common::programs;
use limiter_tests::{
    kernel,
    packet::{ETH_P_IP, Frame, IPPROTO_UDP},
};

use super::{ROUNDS, deny, measure};

fn frame(a: [u8; 4]) -> Vec<u8> {
    Frame::eth(ETH_P_IP).ipv4(Ipv4Addr::from(a), IPPROTO_UDP, 0, 0).udp().payload(22).bytes
}

fn net(s: &str) -> IpNet {
    s.parse().expect("a network")
}

/// A data plane under `groups` (policy text), prefixes at the highest
/// rate, with the tries holding `nets`.
fn open(groups: &str, nets: &[(IpNet, u32)]) -> DataPlane {
    let text = format!("rate = 16000000000\nburst = 1099511627776\ncapacity = 4096\n{groups}");
    let c = limiter::policy::file::parse("bench.toml", text).expect("policy").check().expect("policy");
    let mut l = kernel::open_bench(&c, 4096);
    l.maps.apply(&c).expect("apply");
    l.maps.tables().write_groups(&GroupWrites { upserts: nets.to_vec(), deletes: Vec::new() }).expect("tries");
    l
}

pub fn groups() {
    per_packet();
    println!();
    flood();
    println!();
    real_data();
}

/// The per-packet cost of a rate group's address and a denied group's,
/// beside the plain admitted path and a deny-set network's drop.
fn per_packet() {
    let groups = "[[group]]\nname = \"rate\"\npath = \"/g\"\nasns = [1]\nrate = 16000000000\nburst = \
                  1099511627776\n[[group]]\nname = \"denied\"\npath = \"/g\"\nasns = [2]\naction = \"deny\"\n";
    let mut l = open(groups, &[(net("198.18.5.0/24"), 0), (net("198.18.7.0/24"), 1)]);
    let mut set = DenySet::new(16, 24, 64);
    let o = set.origin("bench").expect("origin");
    set.add(o, &net("198.18.8.0/24")).expect("fits");
    l.maps.tables().write_deny(&set.finish()).expect("deny set");
    l.load_program(programs::LIMITER).expect("load");
    let (plain, grouped, denied, listed) =
        (frame([198, 18, 6, 1]), frame([198, 18, 5, 1]), frame([198, 18, 7, 1]), frame([198, 18, 8, 1]));
    for f in [&plain, &grouped, &denied, &listed] {
        l.test_run(programs::LIMITER, f, 1).expect("first packet");
    }
    let mut rows: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        rows[0].push(measure(&mut l, programs::LIMITER, &plain, kernel::XDP_PASS));
        rows[1].push(measure(&mut l, programs::LIMITER, &grouped, kernel::XDP_PASS));
        rows[2].push(measure(&mut l, programs::LIMITER, &listed, kernel::XDP_DROP));
        rows[3].push(measure(&mut l, programs::LIMITER, &denied, kernel::XDP_DROP));
    }
    let [plain_ns, group_ns, listed_ns, denied_ns] = rows.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v.first().copied().unwrap_or(f64::NAN)
    });
    println!("groups, per packet, {ROUNDS} interleaved rounds, 64-byte UDP/IPv4 frame (least disturbed round)");
    println!(
        "{:>12} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "admitted", "rate group", "deny set", "denied grp", "grp/adm", "dgrp/deny"
    );
    println!(
        "{plain_ns:>12.1} {group_ns:>12.1} {listed_ns:>12.1} {denied_ns:>12.1} {:>10.2} {:>10.2}",
        group_ns / plain_ns,
        denied_ns / listed_ns
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "goal: an address in a rate group at most 1.1x the plain admitted path {}",
        met(group_ns <= 1.1 * plain_ns)
    );
    println!(
        "goal: an address in a denied group at most the deny set's cost (1.05x for noise) {}",
        met(denied_ns <= 1.05 * listed_ns)
    );
}

/// A rate group of 10,000/s (burst 1,000) flooded at 90,000/s over 1,000
/// of its /24s for 2 s of the injected clock, while a client of another
/// group sends 1,000/s.
fn flood() {
    const RATE: u64 = 10_000;
    const BURST: u64 = 1_000;
    const SECS: u64 = 2;
    let groups = format!(
        "[[group]]\nname = \"flooded\"\npath = \"/g\"\ncountries = [\"AA\"]\nrate = {RATE}\nburst = {BURST}\n[[group]]\nname \
         = \"other\"\npath = \"/g\"\ncountries = [\"BB\"]\nrate = {RATE}\nburst = {BURST}\n"
    );
    let mut l = open(&groups, &[(net("10.0.0.0/14"), 0), (net("10.8.0.0/16"), 1)]);
    let t0 = 9_000_000_000_000u64;
    let (flood_pps, client_pps) = (9 * RATE, 1_000);
    let (mut admitted, mut client_lost, mut sent) = (0u64, 0u64, 0u64);
    let step = 1_000_000_000 / flood_pps;
    let every = flood_pps / client_pps;
    let start = Instant::now();
    for i in 0..flood_pps * SECS {
        let now = t0 + i * step;
        // /24 number i % 1000 of 10.0.0.0/14, a host of it.
        let p = u32::try_from(i % 1000).expect("small");
        let src = Ipv4Addr::from(
            u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (p << 8) + 1 + u32::try_from(i / 1000 % 250).expect("small"),
        );
        l.set_test_clock(now).expect("clock");
        let (a, _) = l.test_run(programs::LIMITER_TEST_CLOCK, &frame(src.octets()), 1).expect("run");
        admitted += u64::from(a == kernel::XDP_PASS);
        sent += 1;
        if i % every == 0 {
            let (a, _) = l.test_run(programs::LIMITER_TEST_CLOCK, &frame([10, 8, 3, 7]), 1).expect("run");
            client_lost += u64::from(a != kernel::XDP_PASS);
        }
    }
    #[expect(clippy::cast_precision_loss, reason = "a report")]
    let ratio = admitted as f64 / (BURST + RATE * SECS) as f64;
    println!(
        "a group of {RATE}/s (burst {BURST}) flooded at {flood_pps}/s over 1,000 of its /24s for {SECS} s (injected clock): \
         {admitted} of {sent} admitted, {ratio:.4}x its allowance (burst + rate x time); a client of another group at \
         {client_pps}/s lost {client_lost} ({:.1} s)",
        start.elapsed().as_secs_f64()
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "goal: a group under a flood over 1,000 of its /24s admitted within 1.05x of its rate {}",
        met((0.95..=1.05).contains(&ratio))
    );
    println!("goal: a 9x flood from one group costs a conforming client of another nothing {}", met(client_lost == 0));
}

/// The ASN list's IPv4 networks as one group, then replaced by the WHOIS
/// country database's (a whole new file): times, the longest kernel
/// call, the longest another CPU waited, and memory per network.
fn real_data() {
    let rss = deny::rss;
    let read = |package: &str, name: &str| -> HashSet<IpNet> {
        let t = limiter::groups::read(&limiter_tests::data::ip_location_db(package, name)).expect("read");
        // Every network as the file has it (one group of all of them, not
        // aggregated: the count of a file, not of its union).
        let nets: Vec<IpNet> = t.networks.iter().map(|(n, _)| *n).filter(|n| n.addr().is_ipv4()).collect();
        limiter::nets::coarsen(nets, 24, 56).0
    };
    let rss0 = rss();
    let first = read("asn", "asn-ipv4.csv");
    let user_bytes = rss().saturating_sub(rss0);
    let next = read("geo-whois-asn-country-mmdb", "geo-whois-asn-country-ipv4.mmdb");
    let mut l = open("", &[]);
    let writes =
        |nets: &HashSet<IpNet>| GroupWrites { upserts: nets.iter().map(|n| (*n, 0)).collect(), deletes: Vec::new() };
    let t = Instant::now();
    let longest_load = l.maps.tables().write_groups(&writes(&first)).expect("load");
    let load = t.elapsed();
    let kernel_bytes = l.maps.tables().groups_memory().unwrap_or(0);
    // The next file: its networks written (adds before removes), those it
    // no longer has removed, on CPU 0, while a real-time thread spins on
    // CPU 1 (see `bench deny`).
    let diff = GroupWrites {
        upserts: next.difference(&first).map(|n| (*n, 0)).collect(),
        deletes: first.difference(&next).copied().collect(),
    };
    let changes = diff.upserts.len() + diff.deletes.len();
    let mut tables = l.maps.take_tables().expect("the tables");
    let worker = std::thread::spawn(move || {
        kernel::pin_to_cpu(0);
        let t = Instant::now();
        let longest = tables.write_groups(&diff).expect("replace");
        (t.elapsed(), longest)
    });
    kernel::pin_to_cpu(1);
    let during = deny::spin_until(&|| worker.is_finished());
    let (took, longest_replace) = worker.join().expect("the writer");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    #[expect(clippy::cast_precision_loss, reason = "a report")]
    let per = |b: u64| b as f64 / first.len() as f64;
    println!(
        "real data: the ASN list's {} IPv4 networks (no finer than /24) loaded in {:.2} s (longest call {:.3} ms); \
         replaced by the WHOIS country database's {} ({changes} changes) in {:.2} s (longest call {:.3} ms), CPU 1 \
         taken from a spinning thread at most {:.2} ms meanwhile; memory per network: {:.0} B in the kernel (the \
         tries' memlock), {:.0} B in the daemon (the file's table and the set, as the watcher and the policy state hold them)",
        first.len(),
        load.as_secs_f64(),
        ms(longest_load),
        next.len(),
        took.as_secs_f64(),
        ms(longest_replace),
        ms(during),
        per(kernel_bytes),
        per(user_bytes),
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "goal: {} networks load, diff and reload with no CPU stalled over 10 ms {}",
        first.len(),
        met(during <= Duration::from_millis(10))
    );
}
