//! Talking to a running daemon as its peers do: a TCP handshake through
//! it, `/metrics`, its HTTP listeners, the `limiter` command; and its pins
//! removed when a test ends.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::locate_bin;
use crate::netns::{B_ADDR, VethPair};

/// A listener on `port` in `net.b` and a TCP connection to it from `src`
/// in `net.a`: a handshake the kernel accepted (the source proved its
/// address), held open while both ends are kept.
#[must_use]
pub fn tcp_handshake(net: &VethPair, src: &str, port: u16) -> (std::net::TcpListener, socket2::Socket) {
    let listener = net.b.run_in(|| std::net::TcpListener::bind((B_ADDR, port)).unwrap());
    let src: std::net::SocketAddr = format!("{src}:0").parse().unwrap();
    let dst: std::net::SocketAddr = format!("{B_ADDR}:{port}").parse().unwrap();
    let client = net.a.run_in(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&src.into()).unwrap();
        s.connect_timeout(&dst.into(), Duration::from_secs(5)).unwrap();
        s
    });
    (listener, client)
}

/// `/metrics` of the daemon in `net`'s receiver namespace (its default
/// address, 127.0.0.1:9464), over HTTP.
#[must_use]
pub fn scrape(net: &VethPair) -> String {
    let netload = locate_bin("netload").expect("netload");
    let o = net.b.command(netload).args(["get", "127.0.0.1:9464", "/metrics"]).output().expect("netload get");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("UTF-8")
}

/// An HTTP/1.1 request to 127.0.0.1:`port` in namespace `ns` (the
/// daemon's loopback listeners), with a bearer `token` if given: the
/// status code and the body.
#[must_use]
pub fn http(
    ns: &crate::netns::NetNs,
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if let Some(t) = token {
        req = req + "Authorization: Bearer " + t + "\r\n";
    }
    req = req + "\r\n" + body;
    let out = ns.run_in(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    });
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

/// The value of the series `series` (name and labels, as written) in a
/// scrape; panics, with the scrape, if it is not there.
#[must_use]
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
}

/// `limiter ARGS --socket SOCKET`, to its end.
#[must_use]
pub fn cli(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(locate_bin("limiter").expect("limiter"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("limiter")
}

/// The packets `limiter stats -j` counts for `reason` (e.g.
/// `tcp_out_of_state`) of the daemon at `socket`; 0 when it lists none.
#[must_use]
pub fn reason_packets(socket: &Path, reason: &str) -> u64 {
    let out = cli(socket, &["stats", "-j"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("limiter stats -j: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    j["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["reason"] == reason)
        .and_then(|r| r["packets"].as_u64())
        .unwrap_or(0)
}

/// Removes a test's pins (on bpffs) even when the test fails.
pub struct Pins(pub PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = limiter::dataplane::pin::unload(&self.0, false);
    }
}
