//! `[attacks]`: when the guard says an attack began and ended, and whom
//! it tells.
//!
//! ```toml
//! [attacks]
//! drops_per_sec = 10000        # packets refused a second (dropped, would-be
//!                              # dropped in shadow, answered with a SYN cookie)
//! bits_per_sec = 100000000     # or bits refused a second, whichever is met first
//! sustain = "5s"               # above either this long: an attack begins
//! quiet = "30s"                # below both this long: it ends
//! webhooks = ["https://hooks.example/limiter"]  # told when one starts, grows, ends
//! webhook_timeout = "5s"       # one delivery's bound
//! webhook_ca = "/etc/limiter/hooks-ca.pem"   # trusted for https besides the host's store
//! ```
//!
//! Every key has a default: without the section, attacks are detected
//! with the values above and told to no one but the log, `limiter
//! attacks` and the metrics.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{PolicyError, bad, duration, duration_out};

/// Webhooks one policy may name.
pub const MAX_WEBHOOKS: usize = 8;
/// The longest webhook address.
pub const MAX_URL: usize = 512;

/// The `[attacks]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Attacks {
    #[serde(default = "defaults::drops_per_sec")]
    pub drops_per_sec: u64,
    #[serde(default = "defaults::bits_per_sec")]
    pub bits_per_sec: u64,
    #[serde(default = "defaults::sustain", deserialize_with = "duration", serialize_with = "duration_out")]
    pub sustain: Duration,
    #[serde(default = "defaults::quiet", deserialize_with = "duration", serialize_with = "duration_out")]
    pub quiet: Duration,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<String>,
    #[serde(default = "defaults::webhook_timeout", deserialize_with = "duration", serialize_with = "duration_out")]
    pub webhook_timeout: Duration,
    /// PEM certificates trusted for `https://` webhooks besides the
    /// host's store (a private CA; a receiver's own certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_ca: Option<std::path::PathBuf>,
}

mod defaults {
    use std::time::Duration;

    pub const fn drops_per_sec() -> u64 {
        10_000
    }
    pub const fn bits_per_sec() -> u64 {
        100_000_000
    }
    pub const fn sustain() -> Duration {
        Duration::from_secs(5)
    }
    pub const fn quiet() -> Duration {
        Duration::from_secs(30)
    }
    pub const fn webhook_timeout() -> Duration {
        Duration::from_secs(5)
    }
}

impl Default for Attacks {
    fn default() -> Self {
        Self {
            drops_per_sec: defaults::drops_per_sec(),
            bits_per_sec: defaults::bits_per_sec(),
            sustain: defaults::sustain(),
            quiet: defaults::quiet(),
            webhooks: Vec::new(),
            webhook_timeout: defaults::webhook_timeout(),
            webhook_ca: None,
        }
    }
}

impl Attacks {
    /// Whether it says nothing the defaults do not (not written back).
    #[must_use]
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Check the section.
pub fn check(a: &Attacks) -> Result<(), PolicyError> {
    if a.drops_per_sec == 0 {
        return Err(bad("attacks.drops_per_sec", "must be at least 1"));
    }
    if a.bits_per_sec < 8 * 64 {
        return Err(bad("attacks.bits_per_sec", "must be at least 512 (one 64-byte packet a second)"));
    }
    let secs = |d: Duration, lo: u64, hi: u64| (lo..=hi).contains(&d.as_secs()) && d.subsec_nanos() == 0;
    if !secs(a.sustain, 1, 600) {
        return Err(bad("attacks.sustain", "must be whole seconds from 1s to 10m"));
    }
    if !secs(a.quiet, 1, 3_600) {
        return Err(bad("attacks.quiet", "must be whole seconds from 1s to 1h"));
    }
    if a.webhook_timeout.is_zero() || a.webhook_timeout > Duration::from_mins(1) {
        return Err(bad("attacks.webhook_timeout", "must be from 1ms to 60s"));
    }
    if a.webhooks.len() > MAX_WEBHOOKS {
        return Err(bad("attacks.webhooks", format!("at most {MAX_WEBHOOKS}")));
    }
    if let Some(ca) = &a.webhook_ca
        && !ca.is_absolute()
    {
        return Err(bad("attacks.webhook_ca", "must be an absolute path"));
    }
    for url in &a.webhooks {
        webhook(url).map_err(|why| bad("attacks.webhooks", format!("{url:?}: {why}")))?;
    }
    Ok(())
}

/// A webhook's address, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Webhook {
    /// `https://`: delivered over TLS.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// From its first `/` (at least `/`).
    pub path: String,
}

/// `http://` or `https://HOST[:PORT][/PATH]`, taken apart by the `http`
/// crate's URI parser (hyper's).
pub fn webhook(url: &str) -> Result<Webhook, String> {
    if url.len() > MAX_URL {
        return Err(format!("longer than {MAX_URL} bytes"));
    }
    let uri: hyper::Uri = url.parse().map_err(|e| format!("not an address: {e}"))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("give an http:// or https:// address".into()),
    };
    let authority = uri.authority().ok_or("no host")?;
    if authority.as_str().contains('@') {
        return Err("carries a user or password (put a secret in the path, not the address's user part)".into());
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    // A port given (after the host, past an IPv6 host's brackets) must
    // read as one.
    let given = authority.as_str().rsplit(']').next().is_some_and(|r| r.contains(':'));
    let port = match authority.port_u16() {
        Some(p) => p,
        None if given => return Err("a bad port".into()),
        None if tls => 443,
        None => 80,
    };
    if host.is_empty() || port == 0 {
        return Err("no host or port".into());
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Ok(Webhook { tls, host: host.to_owned(), port, path: if path.is_empty() { "/" } else { path }.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_addresses_are_taken_apart_and_bad_ones_refused() {
        let w = webhook("http://198.18.0.9:8080/hook?k=v").unwrap();
        assert_eq!(w, Webhook { tls: false, host: "198.18.0.9".into(), port: 8080, path: "/hook?k=v".into() });
        let w = webhook("http://[2001:2::9]/x").unwrap();
        assert_eq!((w.host.as_str(), w.port, w.path.as_str()), ("2001:2::9", 80, "/x"));
        assert_eq!(webhook("http://hooks.example").unwrap().path, "/");
        let w = webhook("https://hooks.example/x").unwrap();
        assert_eq!((w.tls, w.host.as_str(), w.port, w.path.as_str()), (true, "hooks.example", 443, "/x"));
        assert!(!webhook("http://hooks.example").unwrap().tls);
        for bad in ["ftp://x/", "http://", "http://a:b/", "http://u:p@h/", "http://h/a b", "http://h:0/"] {
            assert!(webhook(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_defaults_pass_and_each_bound_is_named() {
        check(&Attacks::default()).unwrap();
        let e = check(&Attacks { sustain: Duration::ZERO, ..Attacks::default() }).unwrap_err();
        assert_eq!(e.field, "attacks.sustain");
        let e = check(&Attacks { webhooks: vec!["gopher://x".into()], ..Attacks::default() }).unwrap_err();
        assert_eq!(e.field, "attacks.webhooks");
        let e = check(&Attacks { webhook_ca: Some("ca.pem".into()), ..Attacks::default() }).unwrap_err();
        assert_eq!(e.field, "attacks.webhook_ca");
    }
}
