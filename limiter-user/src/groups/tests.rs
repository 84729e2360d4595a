use super::*;

fn table(text: &str) -> Result<Table, csv::Error> {
    csv::read(text.as_bytes())
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn a_csv_range_is_cut_into_the_networks_that_cover_it_exactly() {
    let t = table("start,end,asn\n192.0.3.0,192.0.4.255,64500,\"Example, Inc.\"\n2001:db9::,2001:db9::ff,AS64501\n")
        .unwrap_or_else(|_| panic!("a valid list"));
    let of = |asn| t.networks.iter().filter(|(_, g)| g.asn == Some(asn)).map(|(n, _)| *n).collect::<Vec<_>>();
    // 192.0.3.0 - 192.0.4.255 is not one network: two /24s.
    assert_eq!(of(64500), nets(&["192.0.3.0/24", "192.0.4.0/24"]));
    assert_eq!(of(64501), nets(&["2001:db9::/120"]));
    let first = "192.0.3.7".parse().unwrap();
    assert_eq!(t.tag_of(first), Some(Tag { country: None, asn: Some(64500) }));
    assert_eq!(t.tag_of("192.0.5.0".parse().unwrap()), None);
}

#[test]
fn a_bad_line_is_named_and_the_table_is_refused() {
    for (text, line, says) in [
        ("1.0.0.0,1.0.0.255,13335\n1.0.4.0,1.0.3.255,38803\n", 2, "low to high"),
        ("1.0.0.0/24,DE\nnot-an-address,DE\n", 2, "not an address"),
        ("1.0.0.1/24,DE\n", 1, "host bits"),
        ("1.0.0.0/24,Germany\n", 1, "neither an ASN"),
        ("1.0.0.0,::1,13335\n", 1, "one family"),
    ] {
        match table(text) {
            Err(csv::Error::Line { line: l, why }) => {
                assert_eq!(l, line, "{text:?}: {why}");
                assert!(why.contains(says), "{text:?}: {why}");
            }
            _ => panic!("{text:?} was read"),
        }
    }
}

#[test]
fn a_group_never_covers_a_special_purpose_network() {
    // A country list that (wrongly) holds all of 10.0.0.0/7 and 198.16.0.0/13.
    let t = table("10.0.0.0/7,ZZ\n198.16.0.0/13,zz\n100.64.1.0/24,ZZ\n").unwrap_or_else(|_| panic!("a valid list"));
    let chosen = t.select(&[*b"ZZ"], &[]);
    // 10/8 and 198.18/15 go; 11/8 and the rest of 198.16/13 stay; a
    // network inside the carrier range goes whole.
    assert_eq!(chosen, nets(&["11.0.0.0/8", "198.16.0.0/15", "198.20.0.0/14"]));
    for b in bogons::BOGONS {
        let b: IpNet = b.parse().unwrap();
        assert!(chosen.iter().all(|n| !n.contains(&b) && !b.contains(n)), "{b} in {chosen:?}");
    }
    assert!(t.select(&[*b"DE"], &[64500]).is_empty());
}

#[test]
fn a_database_is_told_from_a_list_by_its_metadata_marker() {
    let mut db = vec![0u8; 64];
    db.extend_from_slice(b"\xab\xcd\xefMaxMind.com");
    db.extend_from_slice(&[0xe0; 16]);
    assert!(mmdb::is_mmdb(&db));
    assert!(!mmdb::is_mmdb(b"1.0.0.0/24,DE\n"));
    // A broken database is refused with the crate's reason.
    assert!(matches!(mmdb::read(db), Err(mmdb::Error::Db(_))));
}

#[test]
fn a_sorted_table_finds_an_address_by_bisection_and_says_the_same_as_a_scan() {
    let text = "network,country\n203.0.113.128/25,FR\n192.0.3.0/24,DE\n2001:db9::/32,NL\n192.0.4.0/23,DE\n";
    let scanned = table(text).unwrap_or_else(|_| panic!("a valid list"));
    let mut sorted = table(text).unwrap_or_else(|_| panic!("a valid list"));
    sorted.sort();
    for a in ["192.0.3.9", "192.0.5.255", "192.0.6.0", "203.0.113.200", "203.0.113.1", "2001:db9::1", "10.0.0.1"] {
        let a = a.parse().unwrap();
        assert_eq!(sorted.tag_of(a), scanned.tag_of(a), "{a}");
    }
    assert_eq!(sorted.tag_of("192.0.5.1".parse().unwrap()).and_then(|t| t.country), Some(*b"DE"));
}

#[test]
fn networks_finer_than_a_bucket_prefix_are_left_out_and_counted() {
    let (kept, left) = coarsen(nets(&["198.18.0.0/23", "198.18.2.0/25", "2001:2::/48", "2001:2:0:1::/72"]), 24, 56);
    assert_eq!(left, 2);
    assert!(kept.contains(&"198.18.0.0/23".parse().unwrap()) && kept.contains(&"2001:2::/48".parse().unwrap()));
}
