//! The country and ASN readers on real, current data: the npm registry's
//! ip-location-db packages at version 2.3.2026061719 (`cargo xtask setup`
//! fetches them with `npm pack`): GeoLite2 Country and the WHOIS-based
//! country database as MaxMind files, the ASN list as CSV. Every check is
//! against the files' own text or another source, never the reader's.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Instant,
};

use ipnet::IpNet;
use limiter::groups::{self, Format, Tag};

fn file(package: &str, name: &str) -> PathBuf {
    limiter_tests::data::ip_location_db(package, name)
}

fn read(path: &Path) -> groups::Table {
    let t = Instant::now();
    let table = groups::read(path).unwrap_or_else(|e| panic!("{e}"));
    let size = std::fs::metadata(path).unwrap().len();
    eprintln!(
        "{}: {} networks ({} untagged) from {size} bytes in {:?}",
        path.display(),
        table.networks.len(),
        table.untagged,
        t.elapsed()
    );
    table
}

/// The tag of the network holding `addr` in `sorted` (disjoint networks,
/// by first address).
fn lookup(sorted: &[(IpNet, Tag)], addr: IpAddr) -> Option<Tag> {
    let i = sorted.partition_point(|(n, _)| n.network() <= addr);
    let (n, t) = sorted.get(i.checked_sub(1)?)?;
    n.contains(&addr).then_some(*t)
}

fn size(n: &IpNet) -> u128 {
    1u128 << (u32::from(n.max_prefix_len()) - u32::from(n.prefix_len()))
}

#[test]
fn every_range_of_the_asn_list_is_covered_exactly_by_its_networks() {
    let _alone = limiter_tests::alone(module_path!());
    let path = file("asn", "asn-ipv4.csv");
    let table = read(&path);
    assert_eq!(table.format, Format::Csv);
    let mut sorted = table.networks.clone();
    sorted.sort_by_key(|(n, _)| n.network());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() > 300_000, "{} lines", lines.len());
    assert!(table.networks.len() >= lines.len(), "a range is one network or more");
    // Every 500th line, read here with a split of its own: the networks
    // from its start to its end are all of its ASN and add up to its size.
    let mut checked = 0;
    for line in lines.iter().step_by(500) {
        let f: Vec<&str> = line.splitn(4, ',').collect();
        let (start, end): (IpAddr, IpAddr) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        let asn: u32 = f[2].parse().unwrap();
        let (IpAddr::V4(a), IpAddr::V4(b)) = (start, end) else { panic!("{line}") };
        let from = sorted.partition_point(|(n, _)| n.network() < start);
        let mut covered = 0u128;
        for (n, t) in &sorted[from..] {
            if n.network() > end {
                break;
            }
            assert_eq!(t.asn, Some(asn), "{n} in the range of {line}");
            covered += size(n);
        }
        assert_eq!(covered, u128::from(u32::from(b) - u32::from(a)) + 1, "{line}");
        checked += 1;
    }
    assert!(checked > 600);
    // Known holders: Cloudflare's resolver and Google's.
    assert_eq!(lookup(&sorted, "1.1.1.1".parse().unwrap()).and_then(|t| t.asn), Some(13335));
    assert_eq!(lookup(&sorted, "8.8.8.8".parse().unwrap()).and_then(|t| t.asn), Some(15169));
    // A group of Cloudflare's ASN: its resolver's network, no
    // special-purpose network, fewer networks than it has lines.
    let cloudflare = table.select(&[], &[13335]);
    let lines_13335 = lines.iter().filter(|l| l.split(',').nth(2) == Some("13335")).count();
    assert!(cloudflare.iter().any(|n| n.contains(&"1.1.1.1".parse::<IpAddr>().unwrap())));
    assert!(!cloudflare.is_empty() && cloudflare.len() <= lines_13335 * 4, "{} networks", cloudflare.len());
    for b in limiter::nets::bogons::BOGONS {
        let b: IpNet = b.parse().unwrap();
        assert!(cloudflare.iter().all(|n| !n.contains(&b) && !b.contains(n)), "{b}");
    }
}

#[test]
fn two_country_databases_agree_on_most_addresses() {
    let _alone = limiter_tests::alone(module_path!());
    let geolite = read(&file("geolite2-country-mmdb", "geolite2-country.mmdb"));
    let whois = read(&file("geo-whois-asn-country-mmdb", "geo-whois-asn-country.mmdb"));
    for t in [&geolite, &whois] {
        assert_eq!(t.format, Format::Mmdb);
        let v6 = t.networks.iter().filter(|(n, _)| matches!(n, IpNet::V6(_))).count();
        assert!(t.networks.len() - v6 > 100_000 && v6 > 50_000, "{} networks, {v6} IPv6", t.networks.len());
        assert!(t.networks.iter().all(|(_, g)| g.country.is_some_and(|c| c.iter().all(u8::is_ascii_uppercase))));
    }
    let mut sorted = whois.networks.clone();
    sorted.sort_by_key(|(n, _)| n.network());
    // The first address of every 200th GeoLite2 network, asked of the
    // WHOIS-based database: the same country for most (they are built
    // from different sources: 77% agreed at this version).
    let (mut same, mut asked) = (0, 0);
    for (n, t) in geolite.networks.iter().step_by(200) {
        if let Some(w) = lookup(&sorted, n.network()) {
            asked += 1;
            same += usize::from(w.country == t.country);
        }
    }
    eprintln!("{same} of {asked} sampled addresses have one country in both");
    assert!(asked > 1_000 && same * 100 >= asked * 60, "{same} of {asked}");
    // A country group never holds a special-purpose network.
    let de = geolite.select(&[*b"DE"], &[]);
    assert!(de.len() > 1_000, "{} networks", de.len());
    for b in limiter::nets::bogons::BOGONS {
        let b: IpNet = b.parse().unwrap();
        assert!(de.iter().all(|n| !n.contains(&b) && !b.contains(n)), "{b}");
    }
}
