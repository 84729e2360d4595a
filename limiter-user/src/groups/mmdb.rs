//! MaxMind-format databases, read with the `maxminddb` crate: every
//! network with its country (`country.iso_code`, else
//! `registered_country.iso_code`, else ip-location-db's `country_code`)
//! and its ASN (`autonomous_system_number`, else `asn`). IPv4 networks
//! that an IPv6 database repeats under its IPv4-mapped aliases are read
//! once.

use serde::Deserialize;

use super::{MAX_NETWORKS, Table, Tag};

/// What ends every MaxMind database, before its metadata.
const MARKER: &[u8] = b"\xab\xcd\xefMaxMind.com";
/// The metadata section is at most 128 KiB from the end.
const METADATA_MAX: usize = 128 << 10;

/// The most records a walk visits, a network's or not: a crafted tree
/// (a chain of nodes whose children are both the next) reaches 2^128 of
/// them, which no real database holds (GeoLite2 City, the largest, has
/// about 5 million).
pub const MAX_RECORDS: u64 = 16_000_000;
/// The longest a walk may take (GeoLite2 Country takes about a second).
pub const MAX_WALK: std::time::Duration = std::time::Duration::from_mins(1);

pub(super) enum Error {
    Db(String),
    TooMany,
    /// The walk visited more records, or took longer, than its bound.
    Endless(String),
}

pub(super) fn is_mmdb(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(METADATA_MAX)..];
    tail.windows(MARKER.len()).any(|w| w == MARKER)
}

#[derive(Deserialize)]
struct Iso<'a> {
    #[serde(borrow, default)]
    iso_code: Option<&'a str>,
}

#[derive(Deserialize)]
struct Record<'a> {
    #[serde(borrow, default)]
    country: Option<Iso<'a>>,
    #[serde(borrow, default)]
    registered_country: Option<Iso<'a>>,
    #[serde(borrow, default)]
    country_code: Option<&'a str>,
    #[serde(default)]
    autonomous_system_number: Option<u32>,
    #[serde(default)]
    asn: Option<u32>,
}

pub(super) fn read(bytes: Vec<u8>) -> Result<Table, Error> {
    read_bounded(bytes, MAX_RECORDS, MAX_WALK)
}

/// [`read`], visiting at most `max_records` records in at most `max_walk`.
pub(super) fn read_bounded(bytes: Vec<u8>, max_records: u64, max_walk: std::time::Duration) -> Result<Table, Error> {
    let db = |e: maxminddb::MaxMindDbError| Error::Db(e.to_string());
    let reader = maxminddb::Reader::from_source(bytes).map_err(db)?;
    let (mut networks, mut untagged) = (Vec::new(), 0);
    let (start, mut visited) = (std::time::Instant::now(), 0u64);
    for found in reader.networks(maxminddb::WithinOptions::default()).map_err(db)? {
        visited += 1;
        if visited > max_records {
            return Err(Error::Endless(format!("tree holds more than {max_records} records (a crafted file?)")));
        }
        if visited.is_multiple_of(4096) && start.elapsed() > max_walk {
            return Err(Error::Endless(format!("tree was not read within {} s (a crafted file?)", max_walk.as_secs())));
        }
        let found = found.map_err(db)?;
        let net = found.network().map_err(db)?;
        let net = super::network(net.ip(), net.prefix()).ok_or_else(|| Error::Db(format!("{net} is not a network")))?;
        let Some(r) = found.decode::<Record<'_>>().map_err(db)? else {
            untagged += 1;
            continue;
        };
        let country =
            [r.country.and_then(|i| i.iso_code), r.registered_country.and_then(|i| i.iso_code), r.country_code]
                .into_iter()
                .flatten()
                .find_map(super::country);
        let tag = Tag { country, asn: r.autonomous_system_number.or(r.asn) };
        if tag == Tag::default() {
            untagged += 1;
            continue;
        }
        if networks.len() >= MAX_NETWORKS {
            return Err(Error::TooMany);
        }
        networks.push((net, tag));
    }
    Ok(Table { format: super::Format::Mmdb, networks, untagged })
}
