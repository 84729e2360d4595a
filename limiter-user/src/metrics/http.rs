//! `GET /metrics` over HTTP/1: bounded connections shared fairly among
//! peers, header and lifetime timeouts, scrapes rate-limited per peer (429
//! past it, and the connection closed), one snapshot from the daemon loop
//! per scrape.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{Method, Request, Response, body::Bytes, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

use super::{Snapshot, render};
use crate::listen::{Conn, rate::PerPeer};

/// A scrape's request for a snapshot, answered by the daemon loop.
pub type ScrapeCall = oneshot::Sender<Snapshot>;

/// Scrapers served at once; more are closed at accept.
pub const MAX_CONNS: usize = 32;
/// A request's headers must arrive this fast (also bounds an idle
/// keep-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection lives longer than this; scrapers reconnect.
const CONN_LIFETIME: Duration = Duration::from_mins(1);
/// Scrapes per second one peer may make, and its burst: far above any
/// Prometheus (one every few seconds) or an operator's `curl`.
pub const SCRAPES_PER_SEC: (u32, u32) = (5, 10);

/// Serve `GET /metrics` on `addr`; every scrape asks `snapshots` for fresh
/// numbers. Returns the bound address.
pub async fn serve(addr: SocketAddr, snapshots: mpsc::Sender<ScrapeCall>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let rate = Arc::new(PerPeer::new(SCRAPES_PER_SEC.0, SCRAPES_PER_SEC.1));
    crate::listen::spawn("metrics", listener, MAX_CONNS, move |stream, conn: Conn| {
        let (snapshots, rate) = (snapshots.clone(), Arc::clone(&rate));
        async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (snapshots, rate, conn) = (snapshots.clone(), Arc::clone(&rate), conn.clone());
                async move {
                    let _busy = conn.busy();
                    if let Err(wait) = rate.take(conn.peer, Instant::now()) {
                        return Ok::<_, Infallible>(too_many(wait));
                    }
                    Ok(answer(req.method(), req.uri().path(), &snapshots).await)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(16 << 10)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(CONN_LIFETIME, conn).await;
        }
    });
    Ok(bound)
}

async fn answer(method: &Method, path: &str, snapshots: &mpsc::Sender<ScrapeCall>) -> Response<Full<Bytes>> {
    let reply = |code: u16, ctype: &str, body: String| {
        Response::builder()
            .status(code)
            .header("content-type", ctype)
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts are valid")
    };
    if path != "/metrics" {
        return reply(404, "text/plain", "only /metrics is served here\n".into());
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = reply(405, "text/plain", "only GET\n".into());
        r.headers_mut().insert("allow", hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let (tx, rx) = oneshot::channel();
    if snapshots.send(tx).await.is_err() {
        return reply(503, "text/plain", "daemon is stopping\n".into());
    }
    match rx.await {
        Ok(s) => reply(200, "application/openmetrics-text; version=1.0.0; charset=utf-8", render(s)),
        Err(_) => reply(503, "text/plain", "no snapshot\n".into()),
    }
}

/// 429, with when to come back; the connection is closed after it.
fn too_many(wait: Duration) -> Response<Full<Bytes>> {
    let secs = wait.as_secs() + 1;
    Response::builder()
        .status(429)
        .header("content-type", "text/plain")
        .header("retry-after", secs.to_string())
        .header("connection", "close")
        .body(Full::new(Bytes::from(format!(
            "more than {} scrapes a second from one client; retry in {secs} s\n",
            SCRAPES_PER_SEC.0
        ))))
        .expect("static response parts are valid")
}
