//! The kind against what `ipset save` writes: the text below is ipset
//! v7.17's (Debian 12) own output, saved after
//!
//! ```text
//! ipset create office hash:net family inet hashsize 1024 maxelem 65536 comment timeout 0
//! ipset add office 198.18.0.0/24 comment "headquarters"
//! ipset add office 198.18.7.9
//! ipset create office6 hash:net family inet6
//! ipset add office6 2001:2::/48
//! ipset create probes hash:ip family inet
//! ipset add probes 198.18.5.5
//! ipset create r hash:net
//! ipset add r 198.18.10.0-198.18.10.255
//! ```

use super::*;

const SAVED: &str = "\
create office hash:net family inet hashsize 1024 maxelem 65536 timeout 0 comment bucketsize 12 initval 0xe6ad0e59
add office 198.18.7.9 timeout 0
add office 198.18.0.0/24 timeout 0 comment \"headquarters\"
create office6 hash:net family inet6 hashsize 1024 maxelem 65536 bucketsize 12 initval 0x05f9e487
add office6 2001:2::/48
create probes hash:ip family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xf51034c6
add probes 198.18.5.5
create r hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xf0d8e714
add r 198.18.10.0/24
";

fn nets(v: &[&str]) -> BTreeSet<IpNet> {
    v.iter().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn every_sets_members_are_read_whatever_their_options() {
    let want = nets(&["198.18.7.9/32", "198.18.0.0/24", "2001:2::/48", "198.18.5.5/32", "198.18.10.0/24"]);
    assert_eq!(read(SAVED), Ok(want));
}

/// ipset v7.17's lines for a `hash:ip,port` set and a `nomatch` member
/// (with a comment that holds `#` and the word nomatch).
#[test]
fn another_type_a_nomatch_member_or_an_orphan_is_refused_with_its_line() {
    let web = "create web hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0xc83b2ca3\nadd web 198.18.0.1,tcp:80\n";
    let e = read(&format!("{SAVED}{web}")).unwrap_err();
    assert_eq!(e.line, 10);
    assert!(e.why.contains("set web is hash:ip,port, not a set of networks"), "{e}");
    let o = "create o hash:net family inet hashsize 1024 maxelem 65536 counters comment skbinfo bucketsize 12 initval 0x9dda0ce3\n\
             add o 198.18.8.0/24 packets 0 bytes 0\n\
             add o 198.18.9.0/24 nomatch packets 5 bytes 0 comment \"a # nomatch b\"\n";
    let e = read(o).unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.why.contains("198.18.9.0/24 is a nomatch exception"), "{e}");
    let quoted = o.replace(" nomatch packets 5", " packets 5");
    assert_eq!(read(&quoted), Ok(nets(&["198.18.8.0/24", "198.18.9.0/24"])), "a nomatch in a comment refused it");
    let e = read("add office 198.18.0.0/24\n").unwrap_err();
    assert!(e.why.contains("which no `create` line above names"), "{e}");
    let e = read("198.18.0.0/24\n").unwrap_err();
    assert!(e.why.contains("is not a `create` or `add` line of `ipset save`"), "{e}");
}
