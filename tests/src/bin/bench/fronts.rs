//! Bench `forward`: starting the forwarders it compares (the limiter,
//! haproxy 2.6 `mode tcp` with `send-proxy-v2`, nginx 1.22 `stream` with
//! `proxy_protocol on`), each pinned to a CPU in the bench namespace, and
//! any peer's start checked: it listens, or the bench stops with what it
//! said on stderr.

use std::{
    ffi::OsStr,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use limiter_tests::{
    netns::{B_IF, NetNs},
    scenario::{self, Guard, spawn_lines, wait_for},
};

/// `prog` on CPU `cpu` in `ns`.
pub fn pinned(ns: &NetNs, cpu: &str, prog: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", cpu, "nsenter", &format!("--net=/run/netns/{}", ns.name)]).arg(prog);
    c
}

/// Spawns `c`, its stderr kept in `dir/{tag}.err`, and returns once
/// something listens on `port`; if nothing does within 10 s, the bench
/// stops with what it said.
pub fn peer(ns: &NetNs, mut c: Command, dir: &Path, tag: &str, port: u16) -> Guard {
    let err = dir.join(format!("{tag}.err"));
    let guard = Guard(c.stdout(Stdio::null()).stderr(std::fs::File::create(&err).unwrap()).spawn().unwrap());
    if !ns.listens_on(port) {
        let said = std::fs::read_to_string(&err).unwrap_or_default();
        panic!("{tag}: nothing listens on {port} after 10 s; it said: {}", said.trim());
    }
    guard
}

/// A policy with one forwarder from 127.0.0.1:`listen` to `upstream`,
/// `extra` lines in its section.
pub fn limiter_policy(listen: u16, upstream: u16, max: u32, extra: &str) -> String {
    format!("rate = 1000000\nburst = 1000000\n{}", forward_section("bench", listen, upstream, max, extra))
}

/// One `[[forward]]` section named `name`, from 127.0.0.1:`listen` to
/// `upstream`, `extra` lines in it.
pub fn forward_section(name: &str, listen: u16, upstream: u16, max: u32, extra: &str) -> String {
    format!(
        "[[forward]]\nname = \"{name}\"\nlisten = [\"127.0.0.1:{listen}\"]\nupstreams = [\"127.0.0.1:{upstream}\"]\nmax_connections = {max}\n{extra}"
    )
}

/// The limiter on `cpu` with `policy` and its control socket at
/// `socket`, once it listens.
pub fn limiter(ns: &NetNs, cpu: &str, policy: &Path, socket: &Path) -> Guard {
    let mut c = pinned(ns, cpu, scenario::locate_bin("limiter").unwrap());
    c.args(["run", "--iface", B_IF, "--metrics", "off", "--status-interval", "0", "--policy"])
        .arg(policy)
        .arg("--socket")
        .arg(socket);
    let (daemon, log) = spawn_lines(c).unwrap();
    wait_for(&log, "listening on", Duration::from_secs(20), &mut String::new()).unwrap();
    daemon
}

/// Starts a peer forwarder on a CPU: (namespace, directory, CPU, listen
/// port, upstream port).
pub type Peer = fn(&NetNs, &Path, &str, u16, u16) -> Guard;

/// haproxy, `mode tcp`, one thread, to `upstream` with `send-proxy-v2`.
pub fn haproxy(ns: &NetNs, dir: &Path, cpu: &str, listen: u16, upstream: u16) -> Guard {
    let cfg = format!(
        "global\n  nbthread 1\n  maxconn 8000\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\nfrontend fe\n  bind 127.0.0.1:{listen}\n  default_backend be\nbackend be\n  server s 127.0.0.1:{upstream} send-proxy-v2\n"
    );
    configured(ns, dir, cpu, "haproxy", listen, &cfg, &["-db".as_ref(), "-f".as_ref()])
}

/// nginx `stream`, one worker, to `upstream` with `proxy_protocol on`
/// (version 1).
pub fn nginx_stream(ns: &NetNs, dir: &Path, cpu: &str, listen: u16, upstream: u16) -> Guard {
    let block = format!(
        "stream {{\n  server {{\n    listen 127.0.0.1:{listen};\n    proxy_pass 127.0.0.1:{upstream};\n    proxy_protocol on;\n  }}\n}}\n"
    );
    nginx(ns, dir, cpu, listen, Some("ngx_stream_module"), &block)
}

/// nginx in the foreground, one worker, serving `block` (a `stream` or
/// `http` block, listening on `listen`), with `module` loaded first. Its
/// error log is off (a log line a connection would cost it CPU in the
/// rows); what it says at start still reaches stderr.
pub fn nginx(ns: &NetNs, dir: &Path, cpu: &str, listen: u16, module: Option<&str>, block: &str) -> Guard {
    let load = module.map(|m| format!("load_module /usr/lib/nginx/modules/{m}.so;\n")).unwrap_or_default();
    let conf = format!(
        "{load}daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log /dev/null;\npid {}/nginx-{listen}.pid;\nevents {{ worker_connections 8000; }}\n{block}",
        dir.display()
    );
    configured(ns, dir, cpu, "nginx", listen, &conf, &["-p".as_ref(), dir.as_os_str(), "-c".as_ref()])
}

/// `prog` on `cpu` with `args` and then its config, `text` written to
/// `dir/{prog}-{listen}.conf`, once it listens on `listen`.
fn configured(ns: &NetNs, dir: &Path, cpu: &str, prog: &str, listen: u16, text: &str, args: &[&OsStr]) -> Guard {
    let (tag, conf) = (format!("{prog}-{listen}"), dir.join(format!("{prog}-{listen}.conf")));
    std::fs::write(&conf, text).unwrap();
    let mut c = pinned(ns, cpu, prog);
    c.args(args).arg(&conf);
    peer(ns, c, dir, &tag, listen)
}
