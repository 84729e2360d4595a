use std::collections::BTreeSet;

use ipnet::IpNet;
use proptest::prelude::*;

use super::*;

fn nets(list: &[&str]) -> BTreeSet<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// FireHOL level1's shape: a commented header, then networks, some of
/// them special-purpose (its fullbogons part).
const FIREHOL: &str = "#
# firehol_level1
# ipv4 hash:net ipset
#
0.0.0.0/8
1.10.16.0/20
1.19.0.0/16
10.0.0.0/8
2.56.192.0/22
2.56.192.0/22
224.0.0.0/3
";

#[test]
fn a_netset_is_read_and_special_purpose_space_refused_unless_allowed() {
    let p = parse(FIREHOL, Format::Plain, 0, false).unwrap();
    assert_eq!(p.nets, nets(&["1.10.16.0/20", "1.19.0.0/16", "2.56.192.0/22"]));
    assert_eq!((p.refused_count, p.duplicates), (3, 1));
    let lines: Vec<(usize, String)> = p.refused.iter().map(|r| (r.line, r.why.clone())).collect();
    assert_eq!(
        lines,
        [
            (5, "overlaps special-purpose 0.0.0.0/8".to_owned()),
            (8, "overlaps special-purpose 10.0.0.0/8".to_owned()),
            (11, "overlaps special-purpose 224.0.0.0/4".to_owned())
        ]
    );
    let all = parse(FIREHOL, Format::Plain, 0, true).unwrap();
    assert_eq!((all.nets.len(), all.refused_count), (6, 0));
}

#[test]
fn plain_lines_take_comments_addresses_and_mapped_addresses() {
    let text = "1.10.16.0/20 ; SBL256894\n  203.0.114.7  # a host\n\n::ffff:5.6.7.8\n2a00:1450::/32\n";
    let p = parse(text, Format::Plain, 0, false).unwrap();
    assert_eq!(p.nets, nets(&["1.10.16.0/20", "203.0.114.7/32", "5.6.7.8/32", "2a00:1450::/32"]));
}

#[test]
fn ipsum_keeps_the_addresses_listed_often_enough() {
    let text = "# IPsum Threat Intelligence Feed\n#\n# IP\tnumber of (black)lists\n#\n185.224.128.17\t10\n45.148.10.242\t3\n80.94.95.1\t2\n";
    let p = parse(text, Format::Ipsum, 3, false).unwrap();
    assert_eq!(p.nets, nets(&["185.224.128.17/32", "45.148.10.242/32"]));
    assert_eq!(p.below_min, 1);
    let e = parse("1.2.3.4\tmany\n", Format::Ipsum, 3, false).unwrap_err();
    assert_eq!(e, ReadError::NotACount { line: 1, text: "many".into() });
}

#[test]
fn spamhaus_json_is_taken_whole_or_not_at_all() {
    let records = "{\"cidr\":\"1.10.16.0/20\",\"sblid\":\"SBL256894\",\"rir\":\"apnic\"}\n{\"cidr\":\"2a0e:1c80::/29\",\"sblid\":\"SBL1\",\"rir\":\"ripencc\"}\n";
    let meta = |n: u64| {
        format!(
            "{{\"type\":\"metadata\",\"timestamp\":1733000000,\"size\":130,\"records\":{n},\"copyright\":\"(c)\",\"terms\":\"t\"}}\n"
        )
    };
    let p = parse(&(records.to_owned() + &meta(2)), Format::SpamhausJson, 0, false).unwrap();
    assert_eq!(p.nets, nets(&["1.10.16.0/20", "2a0e:1c80::/29"]));
    // Cut short: no metadata, or fewer records than it says.
    assert_eq!(parse(records, Format::SpamhausJson, 0, false).unwrap_err(), ReadError::NoMetadata);
    assert_eq!(
        parse(&(records.to_owned() + &meta(3)), Format::SpamhausJson, 0, false).unwrap_err(),
        ReadError::Records { expected: 3, found: 2 }
    );
    let e = parse("{\"cidr\":\"1.10.16.0/20\"}\n{\"cid", Format::SpamhausJson, 0, false).unwrap_err();
    assert!(matches!(e, ReadError::Json { line: 2, .. }), "{e}");
}

#[test]
fn a_page_that_is_not_a_list_is_refused_where_it_goes_wrong() {
    let page = "<html>\u{1b}[31m<body>403 Forbidden</body></html>\n";
    let e = parse(page, Format::Plain, 0, false).unwrap_err();
    assert_eq!(e.to_string(), "line 1: \"<html>\\\\u{1b}[31m<body>403\" is not an address or a CIDR");
    let e = parse("1.10.16.0/20\n1.10.16.5/20\n", Format::Plain, 0, false).unwrap_err();
    assert_eq!(e.to_string(), "line 2: 1.10.16.5/20 has host bits set (did you mean 1.10.16.0/20?)");
    let long = format!("1.10.16.0/20\n{}\n", "9".repeat(MAX_LINE + 1));
    assert_eq!(parse(&long, Format::Plain, 0, false).unwrap_err(), ReadError::LongLine { line: 2 });
}

fn any_set() -> impl Strategy<Value = BTreeSet<IpNet>> {
    proptest::collection::btree_set((0u32..64, 16u8..=32), 0..40).prop_map(|s| {
        s.into_iter()
            .map(|(i, len)| IpNet::new(std::net::Ipv4Addr::from(0x0100_0000 | (i << 12)).into(), len).unwrap().trunc())
            .collect()
    })
}

proptest! {
    /// Applying the diff to the old set gives the new one, and it moves
    /// only what changed.
    #[test]
    fn a_diff_moves_exactly_what_changed(old in any_set(), new in any_set()) {
        let d = Diff::between(&old, &new);
        let mut got = old.clone();
        for n in &d.remove {
            prop_assert!(got.remove(n));
        }
        for n in &d.add {
            prop_assert!(got.insert(*n));
        }
        prop_assert_eq!(&got, &new);
        prop_assert_eq!(d.add.len() + d.remove.len(), old.symmetric_difference(&new).count());
        prop_assert!(Diff::between(&new, &new).is_empty());
    }
}

#[test]
fn a_feed_file_is_read_bounded_and_errors_name_it() {
    let dir = std::env::temp_dir().join(format!("limiter-feeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let list = dir.join("level1.netset");
    std::fs::write(&list, FIREHOL).unwrap();
    assert_eq!(read(&list, Format::Plain, 0, false).unwrap().nets.len(), 3);
    std::fs::write(&list, "1.10.16.0/20\nnot-a-net\n").unwrap();
    let e = read(&list, Format::Plain, 0, false).unwrap_err();
    assert_eq!(e.to_string(), format!("{}: line 2: \"not-a-net\" is not an address or a CIDR", list.display()));
    // A device is never read (it would never end).
    let e = read(std::path::Path::new("/dev/zero"), Format::Plain, 0, false).unwrap_err();
    assert!(e.to_string().starts_with("/dev/zero: not a regular file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// L2 of the third hardening round: a byte-order mark before the first
/// network refused the whole file.
#[test]
fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let p = parse("\u{feff}1.10.16.0/20\n1.19.0.0/16\n", Format::Plain, 0, false).unwrap();
    assert_eq!(p.nets, nets(&["1.10.16.0/20", "1.19.0.0/16"]));
    // Only at the start: one inside a line is still refused with its line.
    assert!(parse("1.10.16.0/20\n\u{feff}1.19.0.0/16\n", Format::Plain, 0, false).is_err());
}
