//! `[fleet]`: the shared store that keeps window quotas of `scope =
//! "fleet"` across every edge host.
//!
//! ```toml
//! [fleet]
//! store = ["redis://10.0.0.5:6379"]  # one Redis; several addresses: a Redis Cluster's nodes
//! node = "edge-1"                    # this host's name in the fleet (default: the host name)
//! nodes = 8                          # the fleet's size (on_store_failure = "split" divides by it)
//! sync_interval = "200ms"            # push local counts, pull the fleet's, every interval
//! timeout = "1s"                     # a sync slower than this counts as the store being down
//! password_file = "/etc/limiter/redis.password"  # optional: the store's password, one line
//! ```
//!
//! Unix sockets: `redis+unix:///run/redis/redis.sock`.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{PolicyError, bad, duration, duration_out};

/// The fleet's store and this node's place in it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    pub store: Vec<String>,
    #[serde(default = "defaults::node")]
    pub node: String,
    #[serde(default = "defaults::nodes")]
    pub nodes: u32,
    #[serde(default = "defaults::sync_interval", deserialize_with = "duration", serialize_with = "duration_out")]
    pub sync_interval: Duration,
    #[serde(default = "defaults::timeout", deserialize_with = "duration", serialize_with = "duration_out")]
    pub timeout: Duration,
    /// The store's password (`AUTH`), read from this file at each connect:
    /// never written in the policy, printed or logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

/// Largest password file read.
pub const MAX_PASSWORD_FILE: u64 = 4096;

/// `url` with any password in it hidden (for status, logs and `policy
/// show`): `redis://user:secret@host` shows as `redis://user:***@host`.
#[must_use]
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((userinfo, host)) = rest.rsplit_once('@') else { return url.to_owned() };
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{scheme}://{user}:***@{host}")
}

/// A password file that was not read.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    #[error("fleet.password_file {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("fleet.password_file {path}: not a regular file of at most {MAX_PASSWORD_FILE} bytes")]
    NotAFile { path: String },
    #[error("fleet.password_file {path}: empty")]
    Empty { path: String },
}

/// The password in `path`: a regular file of at most 4 KiB, its first
/// line without the line end. Errors say what is wrong, never the content.
pub fn read_password(path: &std::path::Path) -> Result<String, PasswordFileError> {
    use std::io::Read as _;
    let io = |cause| PasswordFileError::Io { path: path.display().to_string(), cause };
    let f = std::fs::File::open(path).map_err(io)?;
    let m = f.metadata().map_err(io)?;
    if !m.is_file() || m.len() > MAX_PASSWORD_FILE {
        return Err(PasswordFileError::NotAFile { path: path.display().to_string() });
    }
    let mut text = String::new();
    f.take(MAX_PASSWORD_FILE).read_to_string(&mut text).map_err(io)?;
    let pw = text.lines().next().unwrap_or("").to_owned();
    if pw.is_empty() {
        return Err(PasswordFileError::Empty { path: path.display().to_string() });
    }
    Ok(pw)
}

mod defaults {
    use std::time::Duration;

    pub fn node() -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "node".into(), |h| h.trim().to_owned())
    }
    pub const fn nodes() -> u32 {
        1
    }
    pub const fn sync_interval() -> Duration {
        Duration::from_millis(200)
    }
    pub const fn timeout() -> Duration {
        Duration::from_secs(1)
    }
}

/// Most store addresses (a cluster's seed nodes).
pub const MAX_STORES: usize = 16;

impl Fleet {
    /// A cluster when several addresses are given.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        self.store.len() > 1
    }
}

/// Check the section.
pub fn check(f: &Fleet) -> Result<(), PolicyError> {
    if f.store.is_empty() || f.store.len() > MAX_STORES {
        return Err(bad("fleet.store", format!("give 1 to {MAX_STORES} addresses")));
    }
    for a in &f.store {
        let ok = a.starts_with("redis://") || a.starts_with("redis+unix://") || a.starts_with("unix://");
        if !ok || redis::parse_redis_url(a).is_none() {
            return Err(bad("fleet.store", format!("{a:?} is not a redis://host:port or redis+unix:///path address")));
        }
        if f.store.len() > 1 && !a.starts_with("redis://") {
            return Err(bad("fleet.store", "a Redis Cluster's nodes are redis://host:port addresses"));
        }
    }
    if f.node.is_empty()
        || f.node.len() > 64
        || !f.node.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(bad("fleet.node", "1 to 64 letters, digits, '-', '_' or '.'"));
    }
    if !(1..=1024).contains(&f.nodes) {
        return Err(bad("fleet.nodes", "1 to 1024"));
    }
    if !(Duration::from_millis(10)..=Duration::from_mins(1)).contains(&f.sync_interval) {
        return Err(bad("fleet.sync_interval", "10ms to 60s"));
    }
    if !(Duration::from_millis(10)..=Duration::from_mins(1)).contains(&f.timeout) {
        return Err(bad("fleet.timeout", "10ms to 60s"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_names_and_intervals_are_checked() {
        let good = Fleet {
            store: vec!["redis://127.0.0.1:6379".into()],
            node: "edge-1".into(),
            nodes: 8,
            sync_interval: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            password_file: None,
        };
        assert_eq!(check(&good), Ok(()));
        assert!(!good.is_cluster());
        let unix = Fleet { store: vec!["redis+unix:///run/redis.sock".into()], ..good.clone() };
        assert_eq!(check(&unix), Ok(()));
        for (f, field) in [
            (Fleet { store: vec![], ..good.clone() }, "fleet.store"),
            (Fleet { store: vec!["http://x".into()], ..good.clone() }, "fleet.store"),
            (Fleet { store: vec!["redis+unix:///a".into(), "redis://b:1".into()], ..good.clone() }, "fleet.store"),
            (Fleet { node: "a b".into(), ..good.clone() }, "fleet.node"),
            (Fleet { nodes: 0, ..good.clone() }, "fleet.nodes"),
            (Fleet { sync_interval: Duration::from_millis(1), ..good.clone() }, "fleet.sync_interval"),
        ] {
            assert_eq!(check(&f).unwrap_err().field, field, "{f:?}");
        }
    }

    #[test]
    fn passwords_are_never_shown_and_their_file_is_bounded() {
        assert_eq!(redacted("redis://:s3cret@10.0.0.5:6379"), "redis://:***@10.0.0.5:6379");
        assert_eq!(redacted("redis://edge:s3cret@h:1/0"), "redis://edge:***@h:1/0");
        assert_eq!(redacted("redis://10.0.0.5:6379"), "redis://10.0.0.5:6379");
        let dir = std::env::temp_dir().join(format!("limiter-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("pw");
        std::fs::write(&p, "s3cret\nignored\n").unwrap();
        assert_eq!(read_password(&p).unwrap(), "s3cret");
        std::fs::write(&p, "x".repeat(5000)).unwrap();
        let e = read_password(&p).unwrap_err().to_string();
        assert!(e.contains("at most 4096 bytes") && !e.contains("xxx"), "{e}");
        assert!(read_password(&dir).unwrap_err().to_string().contains("not a regular file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
