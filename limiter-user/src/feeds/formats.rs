//! The formats a feed is read from, each into one set of networks.

use std::{collections::BTreeSet, net::IpAddr};

use ipnet::IpNet;
use serde::Deserialize;

use crate::nets::{bogons::bogon_overlap, unmapped};

/// Longest line read; a longer one is not a list's (an HTML page, a
/// binary), and the version is refused.
pub const MAX_LINE: usize = 4096;
pub use crate::policy::feed::{Format, MAX_ENTRIES};
/// Refused lines kept for the report (the count covers them all).
const KEPT_REFUSALS: usize = 16;

/// A feed's file, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub nets: BTreeSet<IpNet>,
    /// Entries refused for overlapping special-purpose space (the first
    /// few; `refused_count` counts them all).
    pub refused: Vec<Refused>,
    pub refused_count: usize,
    /// ipsum entries under the minimum count.
    pub below_min: usize,
    /// Entries listed more than once (kept once).
    pub duplicates: usize,
}

/// One entry left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// 1-based.
    pub line: usize,
    pub net: IpNet,
    pub why: String,
}

/// Why a version of a feed is not taken as a whole (the last version
/// stays in force).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("line {line}: longer than {MAX_LINE} bytes (not a list of networks)")]
    LongLine { line: usize },
    #[error("more than {MAX_ENTRIES} networks")]
    TooMany,
    #[error("line {line}: {text:?} is not an address or a CIDR")]
    NotANet { line: usize, text: String },
    #[error("line {line}: {net} has host bits set (did you mean {}?)", net.trunc())]
    HostBits { line: usize, net: IpNet },
    #[error("line {line}: {text:?} is not a count")]
    NotACount { line: usize, text: String },
    #[error("line {line}: not a Spamhaus DROP record: {why}")]
    Json { line: usize, why: String },
    #[error("no metadata line at the end (a download cut short?)")]
    NoMetadata,
    #[error("its metadata says {expected} records, the file holds {found} (a download cut short?)")]
    Records { expected: u64, found: u64 },
}

/// Read `text` written in `format`. `min_count`: ipsum's minimum;
/// `allow_bogons`: take entries that overlap special-purpose space.
pub fn parse(text: &str, format: Format, min_count: u32, allow_bogons: bool) -> Result<Parsed, ReadError> {
    let mut out = Parsed::default();
    let mut records = 0u64;
    let mut metadata = None;
    // A byte-order mark (editors and some exporters write one) is not part
    // of the first line: it refused the whole file.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.len() > MAX_LINE {
            return Err(ReadError::LongLine { line });
        }
        let entry = match format {
            Format::Plain => plain(raw, line)?,
            Format::Ipsum => match ipsum(raw, line)? {
                Some((_, count)) if count < min_count => {
                    out.below_min += 1;
                    None
                }
                e => e.map(|(net, _)| net),
            },
            Format::SpamhausJson => match spamhaus(raw, line)? {
                Json::Net(net) => {
                    records += 1;
                    Some(net)
                }
                Json::Metadata(n) => {
                    metadata = Some(n);
                    None
                }
                Json::Blank => None,
            },
        };
        let Some(net) = entry else { continue };
        if !allow_bogons && let Some(b) = bogon_overlap(&net) {
            out.refused_count += 1;
            if out.refused.len() < KEPT_REFUSALS {
                out.refused.push(Refused { line, net, why: format!("overlaps special-purpose {b}") });
            }
            continue;
        }
        if !out.nets.insert(net) {
            out.duplicates += 1;
        } else if out.nets.len() > MAX_ENTRIES {
            return Err(ReadError::TooMany);
        }
    }
    if format == Format::SpamhausJson {
        match metadata {
            None => return Err(ReadError::NoMetadata),
            Some(expected) if expected != records => return Err(ReadError::Records { expected, found: records }),
            Some(_) => {}
        }
    }
    Ok(out)
}

/// An address (as its host network) or a CIDR, an IPv4-mapped IPv6 one
/// read as IPv4; host bits refused.
fn net(text: &str, line: usize) -> Result<IpNet, ReadError> {
    let parsed = text
        .parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| ReadError::NotANet { line, text: shown(text) })?;
    let net = unmapped(parsed);
    if net.trunc() != net {
        return Err(ReadError::HostBits { line, net });
    }
    Ok(net)
}

/// A line's text as an error shows it: control characters escaped, cut
/// at 64 characters.
fn shown(text: &str) -> String {
    crate::escape_control(&text.chars().take(64).collect::<String>())
}

/// A plain list's line: the network, or nothing (blank, comment).
fn plain(raw: &str, line: usize) -> Result<Option<IpNet>, ReadError> {
    let text = raw.split(['#', ';']).next().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    // "1.10.16.0/20 SBL256894": the first word is the network.
    net(text.split_whitespace().next().unwrap_or_default(), line).map(Some)
}

/// An ipsum line: the address and its count, or nothing.
fn ipsum(raw: &str, line: usize) -> Result<Option<(IpNet, u32)>, ReadError> {
    let text = raw.split('#').next().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    let mut words = text.split_whitespace();
    let addr = net(words.next().unwrap_or_default(), line)?;
    let count = match words.next() {
        None => 1,
        Some(c) => c.parse().map_err(|_| ReadError::NotACount { line, text: shown(c) })?,
    };
    Ok(Some((addr, count)))
}

enum Json {
    Net(IpNet),
    Metadata(u64),
    Blank,
}

/// One line of Spamhaus DROP's JSON form.
fn spamhaus(raw: &str, line: usize) -> Result<Json, ReadError> {
    #[derive(Deserialize)]
    struct Record {
        cidr: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
        records: Option<u64>,
    }
    if raw.trim().is_empty() {
        return Ok(Json::Blank);
    }
    let r: Record = serde_json::from_str(raw).map_err(|e| ReadError::Json { line, why: e.to_string() })?;
    match (r.cidr, r.kind.as_deref(), r.records) {
        (Some(c), _, _) => net(&c, line).map(Json::Net),
        (None, Some("metadata"), Some(n)) => Ok(Json::Metadata(n)),
        _ => Err(ReadError::Json { line, why: "neither a \"cidr\" nor a metadata line with \"records\"".into() }),
    }
}
