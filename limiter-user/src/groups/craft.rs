//! MaxMind databases made by hand, for tests: a search tree of 24-bit
//! records, the data section, and the metadata the readers need. Crafted
//! trees (a chain of nodes whose children are both the next, one node
//! whose records cover a whole family) are what a hostile or broken file
//! holds; the real ones are read in the system tier.

/// A record's value that points at `offset` in the data section of a
/// tree of `nodes` nodes.
#[must_use]
pub fn data_at(nodes: u32, offset: u32) -> u32 {
    nodes + 16 + offset
}

/// A record of data: `{country_code: CODE}`, or an empty map (no data).
#[must_use]
pub fn country(code: Option<&str>) -> Vec<u8> {
    match code {
        Some(c) => [vec![0xe1], text("country_code"), text(c)].concat(),
        None => vec![0xe0],
    }
}

fn text(s: &str) -> Vec<u8> {
    let len = u8::try_from(s.len()).ok().filter(|l| *l < 29).expect("a short string");
    [vec![0x40 | len], s.as_bytes().to_vec()].concat()
}

fn uint(kind: u8, v: u64) -> Vec<u8> {
    let bytes: Vec<u8> = v.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
    let len = u8::try_from(bytes.len()).expect("at most 8 bytes");
    // uint16 (5) and uint32 (6) are plain types; uint64 (9) is extended.
    let head = if kind < 8 { vec![(kind << 5) | len] } else { vec![len, kind - 7] };
    [head, bytes].concat()
}

/// A database of `ip_version` (4 or 6) whose tree is `nodes` (each a
/// left and a right record) and whose data section is `data`.
#[must_use]
pub fn database(ip_version: u16, nodes: &[[u32; 2]], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for [l, r] in nodes {
        out.extend_from_slice(&l.to_be_bytes()[1..]);
        out.extend_from_slice(&r.to_be_bytes()[1..]);
    }
    out.extend_from_slice(&[0; 16]);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\xab\xcd\xefMaxMind.com");
    let count = u64::try_from(nodes.len()).expect("a count");
    let fields: [(&str, Vec<u8>); 9] = [
        ("binary_format_major_version", uint(5, 2)),
        ("binary_format_minor_version", uint(5, 0)),
        ("build_epoch", uint(9, 1)),
        ("database_type", text("limiter-test")),
        ("description", vec![0xe0]),
        ("ip_version", uint(5, u64::from(ip_version))),
        ("languages", vec![0x00, 0x04]),
        ("node_count", uint(6, count)),
        ("record_size", uint(5, 24)),
    ];
    out.push(0xe0 | 9);
    for (k, v) in fields {
        out.extend(text(k));
        out.extend(v);
    }
    out
}

/// The crafted tree of the hostile file: `n` nodes in a chain, both
/// records of each the next node, the last's both an empty map. Its
/// walk visits 2^n records, none with data.
#[must_use]
pub fn chain(n: u32) -> Vec<u8> {
    let nodes: Vec<[u32; 2]> = (0..n).map(|i| if i + 1 < n { [i + 1; 2] } else { [data_at(n, 0); 2] }).collect();
    database(6, &nodes, &country(None))
}

/// One node whose two records hold `code`: a database that gives the
/// whole of IPv6 (and IPv4 inside it) to one country.
#[must_use]
pub fn everything(code: &str) -> Vec<u8> {
    database(6, &[[data_at(1, 0); 2]], &country(Some(code)))
}

/// An IPv4 database holding one network, `net`, of `code`.
#[must_use]
pub fn one_v4(net: ipnet::Ipv4Net, code: &str) -> Vec<u8> {
    let (addr, len) = (u32::from(net.network()), u32::from(net.prefix_len()));
    let nodes: Vec<[u32; 2]> = (0..len)
        .map(|d| {
            let onward = if d + 1 == len { data_at(len, 0) } else { d + 1 };
            // The other side holds nothing (a record equal to the count).
            if (addr >> (31 - d)) & 1 == 1 { [len, onward] } else { [onward, len] }
        })
        .collect();
    database(4, &nodes, &country(Some(code)))
}
