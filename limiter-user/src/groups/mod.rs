//! Who is sending: the country and the autonomous system (ASN) of each
//! network, read from the files operators already fetch: MaxMind-format
//! databases (GeoLite2 Country or ASN, DB-IP lite, IPinfo lite, the
//! ip-location-db builds) and the common CSV lists (`start,end,VALUE,...`
//! or `network,VALUE,...`, VALUE an ASN or a two-letter country code).
//! A group's networks are [`Table::select`]ed from a table read whole;
//! none of them ever covers a special-purpose network (this host's LAN,
//! its loopback, its carrier's CGNAT, the test ranges): those are carved
//! out. The daemon's feature that watches each `[[group]]`'s file and
//! sends its versions to the groups' layer of the policy state
//! (`engine::enforcer::groups`) is `feature`.

#[cfg(any(test, feature = "testing"))]
pub mod craft;
mod csv;
pub mod feature;
pub mod guard;
pub mod layer;
mod mmdb;
pub mod section;
mod series;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use ipnet::{IpNet, Ipv4Net, Ipv4Subnets, Ipv6Net, Ipv6Subnets};

pub use self::series::{GroupHitsReport, GroupReport, GroupReports};
use crate::nets::bogons::carve;

/// The largest file read (GeoLite2 Country is 9 MiB, the ASN CSVs 24 MiB).
pub const MAX_FILE: u64 = 256 << 20;
/// The most networks a table holds (the biggest current list, IPv4 and
/// IPv6 ASNs together, has 515,000 lines).
pub const MAX_NETWORKS: usize = 4_000_000;

/// What a file says of a network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tag {
    /// ISO 3166-1 alpha-2, upper case.
    pub country: Option<[u8; 2]>,
    pub asn: Option<u32>,
}

/// The file's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Mmdb,
    Csv,
}

/// The networks of a file, each with what the file says of it.
#[derive(Debug)]
pub struct Table {
    pub format: Format,
    /// In the file's order; a CSV range is cut into the networks that
    /// cover it exactly.
    pub networks: Vec<(IpNet, Tag)>,
    /// Records with neither a country nor an ASN (a database's networks
    /// without data), left out.
    pub untagged: u64,
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum GroupsError {
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: crate::policy::file::ReadError,
    },
    #[error("{path}: not a MaxMind database: {why}")]
    Mmdb { path: PathBuf, why: String },
    #[error("{path}: line {line}: {why}")]
    Line { path: PathBuf, line: usize, why: String },
    #[error("{path}: more than {MAX_NETWORKS} networks")]
    TooMany { path: PathBuf },
    #[error("{path}: a MaxMind database whose {why}")]
    Endless { path: PathBuf, why: String },
    #[error(
        "{path}: not a list of networks (binary data: a MaxMind database cut short, without its metadata at the end?)"
    )]
    Binary { path: PathBuf },
}

/// Read the table of `path`: a MaxMind database if it ends with one's
/// metadata marker, else a CSV list.
pub fn read(path: &Path) -> Result<Table, GroupsError> {
    let (bytes, _) = crate::policy::file::read_bytes(path, MAX_FILE, "a country or ASN file")
        .map_err(|source| GroupsError::File { path: path.to_owned(), source })?;
    if mmdb::is_mmdb(&bytes) {
        mmdb::read(bytes).map_err(|e| match e {
            mmdb::Error::Db(why) => GroupsError::Mmdb { path: path.to_owned(), why },
            mmdb::Error::TooMany => GroupsError::TooMany { path: path.to_owned() },
            mmdb::Error::Endless(why) => GroupsError::Endless { path: path.to_owned(), why },
        })
    } else if bytes.iter().take(4096).any(|b| *b == 0) {
        // A text list holds no NUL; a database's tree is full of them.
        Err(GroupsError::Binary { path: path.to_owned() })
    } else {
        csv::read(&bytes).map_err(|e| match e {
            csv::Error::Line { line, why } => GroupsError::Line { path: path.to_owned(), line, why },
            csv::Error::TooMany => GroupsError::TooMany { path: path.to_owned() },
        })
    }
}

impl Table {
    /// The networks whose country is one of `countries` or whose ASN is
    /// one of `asns`, aggregated, with every special-purpose network
    /// carved out.
    #[must_use]
    pub fn select(&self, countries: &[[u8; 2]], asns: &[u32]) -> Vec<IpNet> {
        self.select_with(countries, asns, false)
    }

    /// [`Table::select`], keeping the special-purpose networks if
    /// `allow_bogons` (a test bed's own ranges).
    #[must_use]
    pub fn select_with(&self, countries: &[[u8; 2]], asns: &[u32], allow_bogons: bool) -> Vec<IpNet> {
        let wanted =
            |t: &Tag| t.country.is_some_and(|c| countries.contains(&c)) || t.asn.is_some_and(|a| asns.contains(&a));
        let chosen: Vec<IpNet> = self
            .networks
            .iter()
            .filter(|(_, t)| wanted(t))
            .flat_map(|(n, _)| if allow_bogons { vec![*n] } else { carve(*n) })
            .collect();
        IpNet::aggregate(&chosen)
    }

    /// Sort the networks by address, so that [`Table::tag_of`] finds one
    /// by bisection.
    pub fn sort(&mut self) {
        self.networks.sort_unstable_by_key(|(n, _)| (n.network(), std::cmp::Reverse(n.prefix_len())));
    }

    /// What the file says of `addr`: the most specific network holding it
    /// (by bisection in a [`Table::sort`]ed table of disjoint networks, as
    /// the files' are; a scan otherwise).
    #[must_use]
    pub fn tag_of(&self, addr: std::net::IpAddr) -> Option<Tag> {
        let sorted = self.networks.is_sorted_by_key(|(n, _)| n.network());
        if !sorted {
            return self
                .networks
                .iter()
                .filter(|(n, _)| n.contains(&addr))
                .max_by_key(|(n, _)| n.prefix_len())
                .map(|(_, t)| *t);
        }
        let at = self.networks.partition_point(|(n, _)| n.network() <= addr);
        self.networks[..at].iter().rev().take(64).find(|(n, _)| n.contains(&addr)).map(|(_, t)| *t)
    }
}

/// A network of the range `start..=end` (both of one family), cut into
/// the fewest networks that cover it exactly.
fn range_networks(start: std::net::IpAddr, end: std::net::IpAddr) -> Option<Vec<IpNet>> {
    use std::net::IpAddr::{V4, V6};
    match (start, end) {
        (V4(a), V4(b)) if a <= b => Some(Ipv4Subnets::new(a, b, 0).map(IpNet::V4).collect()),
        (V6(a), V6(b)) if a <= b => Some(Ipv6Subnets::new(a, b, 0).map(IpNet::V6).collect()),
        _ => None,
    }
}

/// A network from an address and a prefix length (host bits cleared).
fn network(addr: std::net::IpAddr, len: u8) -> Option<IpNet> {
    match addr {
        std::net::IpAddr::V4(a) => Ipv4Net::new(a, len).ok().map(|n| IpNet::V4(n.trunc())),
        std::net::IpAddr::V6(a) => Ipv6Net::new(a, len).ok().map(|n| IpNet::V6(n.trunc())),
    }
}

/// A two-letter country code, upper-cased.
fn country(text: &str) -> Option<[u8; 2]> {
    match text.as_bytes() {
        [a, b] if a.is_ascii_alphabetic() && b.is_ascii_alphabetic() => {
            Some([a.to_ascii_uppercase(), b.to_ascii_uppercase()])
        }
        _ => None,
    }
}
