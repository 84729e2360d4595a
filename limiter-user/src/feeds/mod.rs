//! Blocklist feeds as files an operator already fetches: FireHOL netsets
//! and other plain lists, ipsum's `IP<TAB>count`, and Spamhaus DROP's
//! JSON lines, read into sets of networks. Reading is bounded (line
//! length, entries) and says where each refused line is; a set is
//! checked against the one it would replace (a truncated download must
//! not lift most of a list) and changes as a diff.
//!
//! This room reads and checks, says what the deny set holds (`series`),
//! and is the daemon's feature that watches the files `[[feed]]` names
//! off its loop (`feature`); the policy state enforces each version
//! through the data plane's deny set (`engine::enforcer::deny`).

pub mod feature;
mod formats;
mod series;

use std::collections::BTreeSet;

use ipnet::IpNet;

pub use self::{
    formats::{Format, MAX_ENTRIES, MAX_LINE, Parsed, ReadError, Refused, parse},
    series::{FeedReport, FeedReports},
};

/// Largest feed file read (a million networks as CIDR text with comments
/// is about 20 MB).
pub const MAX_FILE: u64 = 64 << 20;

/// Why a feed's file gave no set: not read (bounded: a regular file of at
/// most [`MAX_FILE`] bytes), or not a list in its format.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("{path}: {source}")]
    File {
        path: std::path::PathBuf,
        #[source]
        source: crate::policy::file::ReadError,
    },
    #[error("{path}: {source}")]
    Format {
        path: std::path::PathBuf,
        #[source]
        source: ReadError,
    },
}

/// Read the feed file at `path` (see [`parse`]).
pub fn read(path: &std::path::Path, format: Format, min_count: u32, allow_bogons: bool) -> Result<Parsed, FeedError> {
    let text = crate::policy::file::read_text(path, MAX_FILE, "a feed")
        .map_err(|source| FeedError::File { path: path.into(), source })?;
    parse(&text, format, min_count, allow_bogons).map_err(|source| FeedError::Format { path: path.into(), source })
}

/// Where a feed's set moves from one version to the next: only the
/// networks that changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub add: Vec<IpNet>,
    pub remove: Vec<IpNet>,
}

impl Diff {
    /// What turns `old` into `new`.
    #[must_use]
    pub fn between(old: &BTreeSet<IpNet>, new: &BTreeSet<IpNet>) -> Self {
        Self { add: new.difference(old).copied().collect(), remove: old.difference(new).copied().collect() }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

#[cfg(test)]
mod tests;
