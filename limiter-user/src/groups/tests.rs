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
    for b in crate::nets::bogons::BOGONS {
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

/// A crafted tree whose walk never ends (a chain of nodes, each's two
/// records the next) is refused at the bound of records visited, or of
/// time, whichever comes first (G2); every record counts, untagged too.
#[test]
fn an_endless_tree_is_refused_at_its_bound() {
    let db = craft::chain(128);
    assert!(db.len() < 1024, "{} bytes", db.len());
    let start = std::time::Instant::now();
    match mmdb::read_bounded(db.clone(), 20_000, std::time::Duration::from_mins(1)) {
        Err(mmdb::Error::Endless(why)) => assert!(why.contains("more than 20000 records"), "{why}"),
        _ => panic!("read"),
    }
    match mmdb::read_bounded(db, u64::MAX, std::time::Duration::ZERO) {
        Err(mmdb::Error::Endless(why)) => assert!(why.contains("within 0 s"), "{why}"),
        _ => panic!("read"),
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    // A sound one is read: one node, its two records a country each.
    let db = craft::database(4, &[[craft::data_at(1, 0), craft::data_at(1, 0)]], &craft::country(Some("DE")));
    let t = mmdb::read(db).unwrap_or_else(|_| panic!("a valid database"));
    assert_eq!(t.networks.len(), 2);
}

/// A database cut short (no metadata at its end) is said to be one, not
/// a CSV list with a bad line (L3).
#[test]
fn a_database_cut_short_is_named_as_such() {
    let dir = std::env::temp_dir().join(format!("limiter-groups-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.mmdb");
    let db = craft::chain(8);
    std::fs::write(&path, &db[..db.len() - 200]).unwrap();
    let e = read(&path).unwrap_err().to_string();
    assert!(e.contains("MaxMind database cut short"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn group(toml_tail: &str) -> crate::groups::section::Group {
    let text =
        format!("[[group]]\nname = \"g\"\npath = \"/g.csv\"\ncountries = [\"XX\"]\naction = \"deny\"\n{toml_tail}");
    crate::policy::file::parse("t.toml", text).unwrap().policy.groups.remove(0)
}

/// The guards refuse a version that would deny the Internet (a network
/// wider than the widths, more than `max_coverage` of a family), or that
/// grows or shrinks past its bounds against the version in force (G1).
#[test]
fn the_guards_refuse_a_version_that_denies_the_internet() {
    let g = group("");
    let real = nets(&["198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"]);
    let c = guard::check(&g, &real, None).unwrap();
    for (bad, says) in [
        (nets(&["0.0.0.0/0"]), "wider than /6 (min_v4_prefix)"),
        (nets(&["::/1", "8000::/1"]), "wider than /12 (min_v6_prefix)"),
        (
            nets(&[
                "0.0.0.0/6",
                "4.0.0.0/6",
                "8.0.0.0/6",
                "12.0.0.0/6",
                "16.0.0.0/6",
                "20.0.0.0/6",
                "24.0.0.0/6",
                "28.0.0.0/6",
                "32.0.0.0/6",
                "36.0.0.0/6",
                "40.0.0.0/6",
                "44.0.0.0/6",
                "48.0.0.0/6",
                "52.0.0.0/6",
                "56.0.0.0/6",
                "60.0.0.0/6",
                "64.0.0.0/6",
                "68.0.0.0/6",
                "72.0.0.0/6",
                "76.0.0.0/6",
                "80.0.0.0/6",
                "84.0.0.0/6",
                "88.0.0.0/6",
                "92.0.0.0/6",
                "96.0.0.0/6",
                "100.0.0.0/6",
                "104.0.0.0/6",
                "108.0.0.0/6",
                "112.0.0.0/6",
                "116.0.0.0/6",
                "120.0.0.0/6",
                "124.0.0.0/6",
                "128.0.0.0/6",
            ]),
            "more than max_coverage (50.0%)",
        ),
        (
            nets(&[
                "198.51.100.0/24",
                "203.0.113.0/24",
                "192.0.2.0/24",
                "192.0.3.0/24",
                "192.0.4.0/24",
                "2001:db8::/32",
            ]),
            "grew by more than max_growth",
        ),
        (nets(&["198.51.100.0/25", "2001:db8::/32"]), "shrank by more than max_shrink"),
        (nets(&["198.51.100.0/24", "203.0.113.0/24"]), "IPv6"),
    ] {
        let e = guard::check(&g, &bad, Some(c)).unwrap_err();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
    // Within the bounds: taken, and what it covers is the next's base.
    let grown = nets(&["198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24", "2001:db8::/32", "2001:db9::/33"]);
    let next = guard::check(&g, &grown, Some(c)).unwrap();
    assert!(next.v4 > c.v4 && next.v6 > c.v6);
    // The same version is refused with the same words, whatever order
    // its set holds it in: the widest network named, IPv4's first.
    for _ in 0..32 {
        let set: std::collections::HashSet<IpNet> =
            nets(&["::/0", "10.0.0.0/5", "0.0.0.0/0", "::/1"]).into_iter().collect();
        let e = guard::check(&g, &set, None).unwrap_err();
        assert!(e.contains("holds 0.0.0.0/0, wider than /6 (min_v4_prefix)"), "{e}");
    }
    // The widths are the section's: a wider one may be allowed.
    assert!(guard::check(&group("min_v4_prefix = 0\nmax_coverage = 1.0\n"), &nets(&["0.0.0.0/0"]), None).is_ok());
}
