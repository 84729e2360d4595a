//! CrowdSec's Local API as a bouncer reads it: `GET /v1/decisions/stream`
//! with the bouncer's key, `startup=true` once for every decision in
//! force, then only what changed since the last pull. Each decision is
//! typed on the way in: an address denies exactly that address (a /32 or
//! a /128, never its bucket's /24), a range exactly that range, an
//! IPv4-mapped IPv6 address is IPv4, and its duration is a TTL. A pull is
//! bounded in time and bytes, and an answer the LAPI should not give is
//! an error that says what came back.
//!
//! This room reads decisions (`pull`) and keeps pulling them (`watch`:
//! deltas every `update_frequency`, backing off while the LAPI is down);
//! the policy state enforces them through the data plane's deny set.

mod duration;
pub mod feature;
mod series;
mod stream;
mod watch;

#[cfg(test)]
mod tests;

use std::{net::IpAddr, sync::Arc, time::Duration};

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use serde::Deserialize;

use crate::{nets::unmapped, origin::Named};

pub use self::{
    duration::parse_go_duration,
    series::Report,
    watch::{MAX_BACKOFF, PART, Part, Pulled, Status, Watch},
};

/// What the LAPI answers at most for one pull (100,000 decisions take
/// about 20 MB).
pub const MAX_BODY: usize = 64 << 20;
/// How long one pull may take, connection to last byte.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the LAPI is and the bouncer's key (`cscli bouncers add`).
#[derive(Clone, Debug)]
pub struct Lapi {
    /// `host:port`.
    authority: String,
    /// The path the API is under (empty, or `/prefix`).
    base: String,
    key: String,
}

/// A decision, typed (its names shared between the decisions of a pull:
/// a decision takes 56 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub id: i64,
    pub names: Arc<Names>,
    pub net: IpNet,
    /// Time left (zero for a deleted decision's leftover).
    pub ttl: Duration,
}

/// A decision's names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Names {
    /// `cscli`, `crowdsec`, `CAPI`, `lists`, ...
    pub origin: Box<str>,
    pub scenario: Box<str>,
    /// `ban`, `captcha`, ...
    pub kind: Box<str>,
}

impl Decision {
    /// A decision of `net` for `ttl`, with its own names.
    #[must_use]
    pub fn new(id: i64, origin: &str, scenario: &str, kind: &str, net: IpNet, ttl: Duration) -> Self {
        let names = Names { origin: origin.into(), scenario: scenario.into(), kind: kind.into() };
        Self { id, names: Arc::new(names), net, ttl }
    }

    #[must_use]
    pub fn origin(&self) -> &str {
        &self.names.origin
    }

    #[must_use]
    pub fn scenario(&self) -> &str {
        &self.names.scenario
    }

    #[must_use]
    pub fn kind(&self) -> &str {
        &self.names.kind
    }

    /// How `prefix list` would name its source: `crowdsec:ORIGIN`, and for
    /// a blocklist its name (`crowdsec:lists:NAME`).
    #[must_use]
    pub fn source(&self) -> String {
        match self.origin() {
            "lists" => Named::crowdsec(&format!("lists:{}", self.scenario())).to_string(),
            o => Named::crowdsec(o).to_string(),
        }
    }
}

/// One pull: the decisions new since the last, those deleted, and how
/// many were left out and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pull {
    pub new: Vec<Decision>,
    pub deleted: Vec<Decision>,
    /// Scopes other than `ip` and `range` (a country, an AS).
    pub other_scope: usize,
    /// A value that is not an address or a range of its scope.
    pub bad_value: usize,
    /// A new decision whose duration is unreadable or under a second
    /// (gone before it could be enforced).
    pub bad_duration: usize,
}

/// The longest a decision is held (a longer one is held this long): a
/// duration of `999999999h` is a mistake or an attack, not a ban.
pub const MAX_TTL: Duration = Duration::from_hours(366 * 24);

/// Why a pull gave nothing (the decisions in force stay).
#[derive(Debug, thiserror::Error)]
pub enum LapiError {
    #[error("{url:?} is not a LAPI address (http://HOST:PORT[/PATH]; https is not read yet)")]
    Url { url: String },
    #[error("the bouncer key is empty or not one line")]
    BadKey,
    #[error("reading the bouncer key: {0}")]
    KeyFile(String),
    #[error("connecting to the LAPI at {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the LAPI at {authority} did not answer within {} s", .after.as_secs())]
    Timeout { authority: String, after: Duration },
    #[error("the LAPI refused the bouncer key (HTTP {status}): check api_key_file against `cscli bouncers list`")]
    Key { status: u16 },
    #[error("the LAPI answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the LAPI's answer is longer than {max} bytes")]
    TooBig { max: usize },
    #[error("talking to the LAPI: {0}")]
    Http(String),
    #[error("the LAPI's answer is not a decision stream: {0}")]
    Decode(#[from] serde_json::Error),
}

impl Lapi {
    /// `url` is `http://HOST:PORT` (a trailing path is kept as a prefix).
    pub fn new(url: &str, key: &str) -> Result<Self, LapiError> {
        let (authority, base) = crate::policy::crowdsec::lapi_parts(url)
            .ok_or_else(|| LapiError::Url { url: crate::escape_control(url) })?;
        if key.is_empty() || key.contains(['\r', '\n']) {
            return Err(LapiError::BadKey);
        }
        Ok(Self { authority, base, key: key.to_owned() })
    }

    /// One pull of the decision stream: every decision in force with
    /// `startup`, else what changed since this key's last pull. Only the
    /// `ip` and `range` scopes are asked for.
    pub async fn pull(&self, startup: bool) -> Result<Pull, LapiError> {
        let path = format!("{}/v1/decisions/stream?startup={startup}&scopes=ip,range", self.base);
        tokio::time::timeout(PULL_TIMEOUT, self.get(&path))
            .await
            .map_err(|_| LapiError::Timeout { authority: self.authority.clone(), after: PULL_TIMEOUT })?
    }

    /// GET `path`; a 200's body decoded as it arrives (see `stream.rs`),
    /// at most [`MAX_BODY`] bytes.
    async fn get(&self, path: &str) -> Result<Pull, LapiError> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|source| LapiError::Connect { authority: self.authority.clone(), source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| LapiError::Http(e.to_string()))?;
        // The connection is driven while the request runs; it ends with it.
        let driver = tokio::spawn(conn);
        let _end = AbortOnDrop(driver);
        let req = Request::get(path)
            .header("Host", &self.authority)
            .header("X-Api-Key", &self.key)
            .header("User-Agent", concat!("limiter/", env!("CARGO_PKG_VERSION")))
            .body(Empty::<Bytes>::new())
            .map_err(|e| LapiError::Http(e.to_string()))?;
        let res = sender.send_request(req).await.map_err(|e| LapiError::Http(e.to_string()))?;
        let status = res.status();
        if status != StatusCode::OK {
            let body = Limited::new(res.into_body(), 4096)
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
                .unwrap_or_default();
            return Err(match status {
                StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => LapiError::Key { status: status.as_u16() },
                s => {
                    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    LapiError::Status { status: s.as_u16(), body: crate::escape_control(&text) }
                }
            });
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let decoding = tokio::task::spawn_blocking(move || stream::decode_from(stream::Chunks::new(rx)));
        let mut body = res.into_body();
        let mut total = 0usize;
        let mut failed = None;
        while let Some(frame) = body.frame().await {
            let data = match frame {
                Ok(f) => match f.into_data() {
                    Ok(d) => d,
                    Err(_) => continue,
                },
                Err(e) => {
                    failed = Some(LapiError::Http(e.to_string()));
                    break;
                }
            };
            total += data.len();
            if total > MAX_BODY {
                failed = Some(LapiError::TooBig { max: MAX_BODY });
                break;
            }
            // The decoder stopped (a malformed answer): its error says why.
            if tx.send(data).await.is_err() {
                break;
            }
        }
        drop(tx);
        let pull = decoding.await.map_err(|e| LapiError::Http(e.to_string()))?;
        match failed {
            Some(e) => Err(e),
            None => Ok(pull?),
        }
    }
}

/// Aborts the connection's task when the pull ends (or is cancelled).
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A decision as the LAPI writes it.
#[derive(Deserialize)]
struct Raw {
    id: i64,
    #[serde(default)]
    origin: String,
    #[serde(default)]
    scenario: String,
    scope: String,
    #[serde(rename = "type", default)]
    kind: String,
    value: String,
    #[serde(default)]
    duration: String,
}

/// A stream answer's body, typed (see the module's doc).
pub fn decode(body: &[u8]) -> Result<Pull, LapiError> {
    Ok(stream::decode_from(body)?)
}

enum Skip {
    Scope,
    Value,
    Duration,
}

fn typed(r: &Raw, deleted: bool, names: &mut stream::Shared) -> Result<Decision, Skip> {
    let net = match r.scope.to_ascii_lowercase().as_str() {
        "ip" => unmapped(r.value.parse::<IpAddr>().map(IpNet::from).map_err(|_| Skip::Value)?),
        "range" => unmapped(r.value.parse::<IpNet>().map_err(|_| Skip::Value)?).trunc(),
        _ => return Err(Skip::Scope),
    };
    // A deletion's duration is negative (unreadable: zero); a new
    // decision's must be readable and at least a second, and is held at
    // most MAX_TTL.
    let ttl = match parse_go_duration(&r.duration) {
        _ if deleted => Duration::ZERO,
        Some(t) if t >= Duration::from_secs(1) => t.min(MAX_TTL),
        _ => return Err(Skip::Duration),
    };
    // Names from the LAPI are shown by `prefix list` and `status` and
    // logged: control characters escaped (a forged line cannot be shown),
    // and short enough that `crowdsec:lists:NAME` fits the kernel's
    // origin name whole (a longer one, cut in the pins, came back as
    // another origin after each restart).
    let room = limiter_common::deny::ORIGIN_NAME - "crowdsec:lists:".len();
    let these = Names {
        origin: outside_name(&r.origin, room).into(),
        scenario: outside_name(&r.scenario, room).into(),
        kind: outside_name(&r.kind, room).into(),
    };
    Ok(Decision { id: r.id, names: names.get(these), net, ttl })
}

/// A name from outside, its control characters escaped, cut to at most
/// `max` bytes (at a character boundary).
fn outside_name(text: &str, max: usize) -> String {
    let mut s = crate::escape_control(text);
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
