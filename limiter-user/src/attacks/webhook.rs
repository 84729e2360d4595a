//! Webhooks: each attack's start, growth and end POSTed as JSON to every
//! address of `[attacks] webhooks`. Each address has a task of its own
//! behind a bounded queue: a receiver that is down, slow, or answers
//! errors costs the daemon at most its queue, never the loop's time, and
//! never holds another address's deliveries. A delivery is bounded by
//! `webhook_timeout` whole (connect, send, the answer's head), tried
//! [`ATTEMPTS`] times with a back-off; one that never succeeds, or that
//! finds the queue full, is counted and said in `limiter status`. An
//! `https://` address is delivered over TLS (rustls), its certificate
//! checked against the host's store and `webhook_ca`.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::body::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_rustls::rustls;

use crate::control::Attack;
use crate::policy::attacks::{Webhook, webhook};

/// Deliveries waiting per address; past it, an event is dropped.
pub const QUEUE: usize = 32;
/// Tries of one delivery.
pub const ATTEMPTS: u32 = 3;
/// The wait before the second try (doubling for each next one).
const BACKOFF: Duration = Duration::from_secs(1);

/// The body POSTed (docs/attacks.md gives its schema).
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    /// `started`, `updated` or `ended`.
    pub event: &'static str,
    /// This host's name.
    pub host: &'a str,
    pub attack: &'a Attack,
}

/// How one address fares.
#[derive(Debug, Default)]
pub struct Fares {
    pub delivered: AtomicU64,
    /// Deliveries that failed every try.
    pub failed: AtomicU64,
    /// Events the full queue had no room for.
    pub dropped: AtomicU64,
    /// Why the last failed try failed (none since the last delivery).
    pub last_error: Mutex<Option<String>>,
}

/// One address's task.
#[derive(Debug)]
pub struct Hook {
    pub url: String,
    pub fares: Arc<Fares>,
    tx: mpsc::Sender<Arc<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// TLS for the `https://` addresses: the host's roots and those of
/// `ca` (a PEM file), or why there is none.
pub type Tls = Result<Arc<rustls::ClientConfig>, String>;

/// [`Tls`] of the host's store and `ca`.
pub fn tls(ca: Option<&std::path::Path>) -> Tls {
    use rustls_pki_types::{CertificateDer, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    let mut from_ca = 0;
    if let Some(ca) = ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .and_then(Iterator::collect)
            .map_err(|e| format!("webhook_ca {}: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("webhook_ca {}: no certificate in it", ca.display()));
        }
        (from_ca, _) = roots.add_parsable_certificates(certs);
    }
    if added + from_ca == 0 {
        return Err("no trusted certificate: the host's store is empty and no webhook_ca is given".into());
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    Ok(Arc::new(config))
}

impl Hook {
    /// A task delivering to `url` (checked by the policy), each try
    /// bounded by `timeout`; `tls` for an `https://` one.
    fn start(url: &str, timeout: Duration, tls: &Tls) -> Option<Self> {
        let target = webhook(url).ok()?;
        let tls = target.tls.then(|| tls.clone());
        let fares = Arc::new(Fares::default());
        let (tx, mut rx) = mpsc::channel::<Arc<String>>(QUEUE);
        let f = Arc::clone(&fares);
        let task = tokio::spawn(async move {
            while let Some(body) = rx.recv().await {
                let mut wait = BACKOFF;
                for attempt in 1..=ATTEMPTS {
                    match tokio::time::timeout(timeout, deliver(&target, tls.as_ref(), &body)).await {
                        Ok(Ok(())) => {
                            f.delivered.fetch_add(1, Ordering::Relaxed);
                            *f.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                            break;
                        }
                        failed => {
                            let why = match failed {
                                Ok(Err(e)) => e,
                                _ => format!("no answer within {timeout:?}"),
                            };
                            *f.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
                            if attempt == ATTEMPTS {
                                f.failed.fetch_add(1, Ordering::Relaxed);
                            } else {
                                tokio::time::sleep(wait).await;
                                wait *= 2;
                            }
                        }
                    }
                }
            }
        });
        Some(Self { url: url.to_owned(), fares, tx, task })
    }

    /// Queue `body`; counted as dropped when the queue is full.
    fn send(&self, body: &Arc<String>) {
        if self.tx.try_send(Arc::clone(body)).is_err() {
            self.fares.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// POST `body` to `w` (over TLS with `tls`, for an `https://` one): `Ok`
/// on a 2xx answer.
async fn deliver(w: &Webhook, tls: Option<&Tls>, body: &str) -> Result<(), String> {
    let stream = tokio::net::TcpStream::connect((w.host.as_str(), w.port)).await.map_err(|e| e.to_string())?;
    match tls {
        None => send(w, hyper_util::rt::TokioIo::new(stream), body).await,
        Some(tls) => {
            let config = tls.clone()?;
            let name = rustls_pki_types::ServerName::try_from(w.host.clone()).map_err(|e| e.to_string())?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            send(w, hyper_util::rt::TokioIo::new(stream), body).await
        }
    }
}

/// POST `body` to `w` over `io`, an open connection.
async fn send<T>(w: &Webhook, io: T, body: &str) -> Result<(), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let host = if w.host.contains(':') { format!("[{}]:{}", w.host, w.port) } else { format!("{}:{}", w.host, w.port) };
    let req = hyper::Request::post(&w.path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, concat!("limiter/", env!("CARGO_PKG_VERSION")))
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| e.to_string());
    let answer = match req {
        Ok(req) => sender.send_request(req).await.map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    conn.abort();
    let status = answer?.status();
    if status.is_success() { Ok(()) } else { Err(format!("answered {status}")) }
}

/// Every address's task.
#[derive(Debug, Default)]
pub struct Hooks {
    each: Vec<Hook>,
    /// What they were started with.
    urls: Vec<String>,
    timeout: Duration,
    ca: Option<std::path::PathBuf>,
}

impl Hooks {
    /// Exactly `urls`, each try bounded by `timeout`, `https://` ones
    /// trusting `ca` besides the host's store (unchanged: the tasks and
    /// their queues stay).
    pub fn follow(&mut self, urls: &[String], timeout: Duration, ca: Option<&std::path::Path>) {
        if self.urls == urls && self.timeout == timeout && self.ca.as_deref() == ca {
            return;
        }
        let https = urls.iter().any(|u| u.starts_with("https://"));
        let tls = if https { tls(ca) } else { Err("no https webhook".into()) };
        if let (true, Err(e)) = (https, &tls) {
            tracing::warn!("limiter: attacks: https webhooks cannot be told: {e}");
        }
        self.each = urls.iter().filter_map(|u| Hook::start(u, timeout, &tls)).collect();
        self.urls = urls.to_vec();
        self.timeout = timeout;
        self.ca = ca.map(std::path::Path::to_path_buf);
    }

    /// Tell every address of `event` of `attack`.
    pub fn tell(&self, event: &'static str, host: &str, attack: &Attack) {
        if self.each.is_empty() {
            return;
        }
        let Ok(body) = serde_json::to_string(&Body { event, host, attack }) else { return };
        let body = Arc::new(body);
        for h in &self.each {
            h.send(&body);
        }
    }

    /// Each address and how it fares.
    pub fn iter(&self) -> impl Iterator<Item = &Hook> {
        self.each.iter()
    }
}
