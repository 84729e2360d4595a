//! CSV lists: `start,end,VALUE[,...]` (ip-location-db, DB-IP, IPtoASN)
//! or `network,VALUE[,...]` (GeoLite2's CSV, IPinfo), VALUE an ASN
//! (`13335` or `AS13335`) or a two-letter country code; a header line,
//! blank lines and `#` comments are skipped. Only the first three fields
//! are read, so a quoted name with commas after them is never parsed.

use super::{MAX_NETWORKS, Table, Tag};

/// The longest line read (an AS name is rarely over 100 bytes).
const MAX_LINE: usize = 4096;

pub(super) enum Error {
    Line { line: usize, why: String },
    TooMany,
}

pub(super) fn read(bytes: &[u8]) -> Result<Table, Error> {
    let mut networks = Vec::new();
    for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let line = i + 1;
        let bad = |why: String| Error::Line { line, why };
        if raw.len() > MAX_LINE {
            return Err(bad(format!("longer than {MAX_LINE} bytes (not a list of networks)")));
        }
        let text = std::str::from_utf8(raw).map_err(|_| bad("not UTF-8 text".into()))?.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let mut fields = text.splitn(4, ',').map(|f| f.trim().trim_matches('"'));
        let first = fields.next().unwrap_or_default();
        let (nets, value) = if let Ok(net) = first.parse::<ipnet::IpNet>() {
            if net.trunc() != net {
                return Err(bad(format!("{net} has host bits set (did you mean {}?)", net.trunc())));
            }
            (vec![net], fields.next())
        } else if let Ok(start) = first.parse::<std::net::IpAddr>() {
            let end = fields.next().unwrap_or_default();
            let end = end.parse().map_err(|_| bad(format!("{end:?} is not the end address of a range")))?;
            let nets = super::range_networks(start, end)
                .ok_or_else(|| bad(format!("{start} to {end} is not a range of one family, low to high")))?;
            (nets, fields.next())
        } else if line == 1 {
            // A header (`start,end,asn`, `network,country_code`).
            continue;
        } else {
            return Err(bad(format!("{first:?} is not an address or a network")));
        };
        let value = value.unwrap_or_default();
        let tag =
            tag(value).ok_or_else(|| bad(format!("{value:?} is neither an ASN nor a two-letter country code")))?;
        if networks.len() + nets.len() > MAX_NETWORKS {
            return Err(Error::TooMany);
        }
        networks.extend(nets.into_iter().map(|n| (n, tag)));
    }
    Ok(Table { format: super::Format::Csv, networks, untagged: 0 })
}

/// An ASN or a country code.
fn tag(value: &str) -> Option<Tag> {
    let digits = value.strip_prefix("AS").or_else(|| value.strip_prefix("as")).unwrap_or(value);
    if let Ok(asn) = digits.parse::<u32>() {
        return Some(Tag { country: None, asn: Some(asn) });
    }
    super::country(value).map(|c| Tag { country: Some(c), asn: None })
}
