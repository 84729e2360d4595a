//! The feedback endpoint: the tenant layer pushes penalties back over
//! HTTP on a loopback address, with a bearer token:
//!
//! ```text
//! curl -s -H "Authorization: Bearer $(cat /etc/limiter/feedback.token)" \
//!      -d '{"prefix":"198.18.5.0/24","ttl":"10m","reason":"credential stuffing"}' \
//!      http://127.0.0.1:9465/v1/penalties
//! ```
//!
//! `POST /v1/penalties` answers 200 with the policy version, 403 without
//! the token, 422 (`bad_request`, `too_wide`, `ttl_too_long`) or 429
//! (`cap`) when the governor refuses; `GET /v1/penalties` lists what
//! feedback decided, with reasons and time left. `POST /v1/load`
//! (`{"forward":"NAME","rejected":N}`) says the tenant layer rejected N
//! connections of a forwarder: its adaptive throttling counts them. Every penalty becomes an
//! ordinary runtime override with a TTL, applied by the daemon's one
//! change machinery; the listener has the bounds of every listener.
//!
//! Also here: the daemon's own escalation of a prefix its bucket keeps
//! dropping (`escalate`: the judgement; `escalation`: the daemon's
//! feature that hears the sampled drops and sends its penalties), and the
//! proof of source it asks first (`proof`); the endpoint's face as a
//! feature of the daemon (`feature`).
//! The policy's `[feedback]` section is `policy::feedback`; the governor,
//! which decides each penalty as a layer of overrides, is the enforcer's.

pub mod escalate;
pub mod escalation;
pub mod feature;
pub mod proof;
mod series;

pub use self::series::{EscalationCounts, FeedbackCounts};

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::control::{ErrorCode, Request as Call, Response as Answer, server::Call as Sent};

/// Clients at once (a quarter of them per peer); a penalty body's largest
/// size, and how long it may take to arrive.
pub const MAX_CONNS: usize = 32;
const MAX_BODY: usize = 16 << 10;
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// A penalty as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Penalty {
    prefix: String,
    /// Only `deny` (the default).
    #[serde(default)]
    action: Option<String>,
    /// `"10m"`, `"1h"`, ...
    ttl: String,
    #[serde(default)]
    reason: String,
}

/// The tenant layer's word that it is overloaded: it rejected `rejected`
/// connections of forwarder `forward` (`POST /v1/load`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Load {
    forward: String,
    rejected: u64,
}

/// Most rejections one `POST /v1/load` reports.
pub const MAX_LOAD_REJECTED: u64 = 1_000_000;

/// Serve on `addr`, with `token` as the bearer token, sending penalties to
/// the daemon through `calls`. Returns the bound address.
/// The feedback endpoint in force: where it listens and the token file it
/// was started with (both take a restart), and the token, which SIGHUP
/// reads again.
#[derive(Debug)]
pub struct Endpoint {
    pub bound: SocketAddr,
    pub token_file: std::path::PathBuf,
    pub token: Token,
}

pub async fn serve(addr: SocketAddr, token: Token, calls: mpsc::Sender<Sent>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    crate::listen::spawn("feedback", listener, MAX_CONNS, move |stream, conn: crate::listen::Conn| {
        let (calls, token) = (calls.clone(), token.current());
        async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (calls, token, conn) = (calls.clone(), Arc::clone(&token), conn.clone());
                async move {
                    let _busy = conn.busy();
                    Ok::<_, Infallible>(answer(req, &token, &calls, &conn.peer).await)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        }
    });
    Ok(bound)
}

/// The bearer token in force, shared with the endpoint so that a SIGHUP
/// can replace it (a connection keeps the token it was accepted with).
#[derive(Clone, Debug)]
pub struct Token(Arc<std::sync::RwLock<Arc<str>>>);

impl Token {
    #[must_use]
    pub fn new(token: &str) -> Self {
        Self(Arc::new(std::sync::RwLock::new(Arc::from(token))))
    }

    /// Take `token` from now on.
    pub fn replace(&self, token: &str) {
        if let Ok(mut t) = self.0.write() {
            *t = Arc::from(token);
        }
    }

    fn current(&self) -> Arc<str> {
        self.0.read().map_or_else(|e| Arc::clone(&e.into_inner()), |t| Arc::clone(&t))
    }
}

/// Largest token file read.
pub const MAX_TOKEN_FILE: u64 = 4096;

/// A feedback token that was not taken (its text is never shown).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("feedback token {path}: {cause}")]
    Read { path: String, cause: crate::policy::file::ReadError },
    #[error("feedback token {path}: at least 16 characters")]
    Short { path: String },
}

/// The token in `path` (its first line, trimmed) and what is weak about
/// it: a regular file of at most 4 KiB (a FIFO or a device is never
/// read), 16 characters or more; warned of when readable by group or
/// others, or made of few distinct characters. Errors never show it.
pub fn read_token(path: &std::path::Path) -> Result<(String, Vec<String>), TokenError> {
    use std::os::unix::fs::PermissionsExt as _;
    let name = path.display();
    let (text, meta) = crate::policy::file::read_text_and_metadata(path, MAX_TOKEN_FILE, "a token")
        .map_err(|cause| TokenError::Read { path: name.to_string(), cause })?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.len() < 16 {
        return Err(TokenError::Short { path: name.to_string() });
    }
    let mut warnings = Vec::new();
    // The mode of the file that was read, not of whatever the path names now.
    if meta.permissions().mode() & 0o077 != 0 {
        warnings.push(format!(
            "feedback token {name} is readable by group or others (mode {:o}): chmod 600 it",
            meta.permissions().mode() & 0o777
        ));
    }
    let distinct = token.chars().collect::<std::collections::HashSet<_>>().len();
    if distinct < 8 {
        warnings.push(format!(
            "feedback token {name} has {distinct} distinct characters: a guessable token; use a random one (for example `openssl rand -hex 32`)"
        ));
    }
    Ok((token, warnings))
}

fn reply(code: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{body}\n"))))
        .expect("static response parts are valid")
}

/// Constant-time comparison of the presented token.
fn authorised(req: &Request<hyper::body::Incoming>, token: &str) -> bool {
    let presented =
        req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    presented
        .is_some_and(|p| p.len() == token.len() && p.bytes().zip(token.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0)
}

async fn ask(calls: &mpsc::Sender<Sent>, call: Call, peer: &crate::listen::Peer) -> Option<Answer> {
    let (tx, rx) =
        crate::control::server::Reply::new(crate::control::server::Requester::Tenant { peer: peer.to_string() });
    calls.send((call, tx)).await.ok()?;
    rx.await.ok()
}

/// The body of a POST, bounded in size and time.
async fn body(req: Request<hyper::body::Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    let fail = |code, message: &str| reply(code, &serde_json::json!({ "error": message }));
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(req.into_body(), MAX_BODY).collect()).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(_)) => Err(fail(StatusCode::PAYLOAD_TOO_LARGE, "at most 16 KiB")),
        Err(_) => Err(fail(StatusCode::REQUEST_TIMEOUT, "the body must arrive within 5 s")),
    }
}

/// `POST /v1/load`: rejections the tenant layer reports, counted by the
/// forwarder's adaptive throttling.
async fn load(
    req: Request<hyper::body::Incoming>,
    calls: &mpsc::Sender<Sent>,
    peer: &crate::listen::Peer,
) -> Response<Full<Bytes>> {
    let fail = |code, message: &str| reply(code, &serde_json::json!({ "error": message }));
    if req.method() != Method::POST {
        return fail(StatusCode::METHOD_NOT_ALLOWED, "POST");
    }
    let body = match body(req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let l: Load = match serde_json::from_slice(&body) {
        Ok(l) => l,
        Err(e) => return fail(StatusCode::UNPROCESSABLE_ENTITY, &format!("bad_request: {e}")),
    };
    if !(1..=MAX_LOAD_REJECTED).contains(&l.rejected) {
        return fail(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("bad_request: rejected must be 1 to {MAX_LOAD_REJECTED}"),
        );
    }
    match ask(calls, Call::Load { forward: l.forward, rejected: l.rejected }, peer).await {
        Some(Answer::Adaptive(a)) => reply(StatusCode::OK, &serde_json::json!(a)),
        Some(Answer::Error { message, .. }) => fail(StatusCode::NOT_FOUND, &message),
        _ => fail(StatusCode::SERVICE_UNAVAILABLE, "the daemon did not answer"),
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    token: &str,
    calls: &mpsc::Sender<Sent>,
    peer: &crate::listen::Peer,
) -> Response<Full<Bytes>> {
    let fail = |code, message: &str| reply(code, &serde_json::json!({ "error": message }));
    let path = req.uri().path();
    if path != "/v1/penalties" && path != "/v1/load" {
        return fail(StatusCode::NOT_FOUND, "only /v1/penalties and /v1/load are served here");
    }
    if !authorised(&req, token) {
        return fail(StatusCode::FORBIDDEN, "a valid bearer token is needed");
    }
    if path == "/v1/load" {
        return load(req, calls, peer).await;
    }
    match *req.method() {
        Method::GET => match ask(calls, Call::PrefixList, peer).await {
            Some(Answer::Prefixes(l)) => {
                let mine: Vec<_> = l.entries.into_iter().filter(|e| e.origin.is_automation()).collect();
                reply(StatusCode::OK, &serde_json::json!({ "version": l.version, "penalties": mine }))
            }
            _ => fail(StatusCode::SERVICE_UNAVAILABLE, "the daemon did not answer"),
        },
        Method::POST => {
            let body = match body(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let p: Penalty = match serde_json::from_slice(&body) {
                Ok(p) => p,
                Err(e) => return fail(StatusCode::UNPROCESSABLE_ENTITY, &format!("bad_request: {e}")),
            };
            if p.action.as_deref().is_some_and(|a| a != "deny") {
                return fail(StatusCode::UNPROCESSABLE_ENTITY, "bad_request: only \"deny\" penalties are taken");
            }
            let ttl = match crate::policy::parse_duration(&p.ttl) {
                Ok(d) => d.as_secs(),
                Err(e) => return fail(StatusCode::UNPROCESSABLE_ENTITY, &format!("bad_request: {e}")),
            };
            match ask(calls, Call::Penalty { cidr: p.prefix, ttl_secs: ttl, reason: p.reason }, peer).await {
                Some(Answer::Applied(a)) => {
                    reply(StatusCode::OK, &serde_json::json!({ "version": a.version, "summary": a.summary }))
                }
                Some(Answer::Error { code, message, .. }) => {
                    let status = match code {
                        ErrorCode::Capped => StatusCode::TOO_MANY_REQUESTS,
                        // The operator or the policy file allows it: a
                        // conflict with a higher layer, not a bad request.
                        ErrorCode::Conflict => StatusCode::CONFLICT,
                        ErrorCode::Busy | ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                        _ => StatusCode::UNPROCESSABLE_ENTITY,
                    };
                    fail(status, &message)
                }
                _ => fail(StatusCode::SERVICE_UNAVAILABLE, "the daemon did not answer"),
            }
        }
        _ => fail(StatusCode::METHOD_NOT_ALLOWED, "GET or POST"),
    }
}
