//! `limiter run`: load, attach, enforce the policy, reload it on SIGHUP,
//! print status; `limiter unload`; `limiter policy check`.

use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    cli::RunArgs,
    daemon::{ApplyError, Daemon},
    loader::Limiter,
    policy::Policy,
    stats::Totals,
};

/// Structured logs on stdout, text or JSON, level from `RUST_LOG`
/// (default `info`). A closed stdout (a supervisor that went away) never
/// takes enforcement down: the writer ignores write errors.
pub fn init_logging(json: bool) {
    use tracing_subscriber::{EnvFilter, fmt};
    struct Lossy;
    impl std::io::Write for Lossy {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _ = std::io::stdout().write_all(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            let _ = std::io::stdout().flush();
            Ok(())
        }
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_target(false).with_ansi(false).with_writer(|| Lossy);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// Run the daemon until SIGINT or SIGTERM.
pub async fn run(args: &RunArgs, socket: &Path) -> anyhow::Result<()> {
    // Handlers first: a signal that arrives during start-up is then handled
    // (cleanly, once the loop runs) instead of killing the process.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let policy = args.load_policy()?;
    // Validate before touching the kernel: a bad policy changes nothing.
    policy.compile(0)?;
    let metrics_addr = match args.metrics.as_str() {
        "off" => None,
        a => Some(a.parse::<std::net::SocketAddr>().map_err(|e| anyhow::anyhow!("--metrics {a:?}: {e}"))?),
    };
    let access = crate::control::server::Access { gid: args.socket_group.as_deref().map(resolve_group).transpose()? };
    raise_memlock();
    let (limiter, adopted) = if args.pin {
        Limiter::open_pinned(policy.capacity, &args.pin_dir)?
    } else {
        (Limiter::open(policy.capacity)?, false)
    };
    // Versions continue from what a re-adopted data plane enforces.
    let version = limiter.active_config()?.map_or(0, |c| c.version);
    let capacity = limiter.capacity()?;
    let limiter_map_id = limiter.buckets_map_id()?;
    let mut d = Daemon {
        limiter,
        iface: args.iface.clone(),
        mode: args.mode,
        pin_dir: args.pin.then(|| args.pin_dir.clone()),
        base: Policy::default(),
        source: String::new(),
        runtime: std::collections::BTreeMap::new(),
        version,
        capacity,
        started: Instant::now(),
        last_reload: None,
        reloads: [0; 2],
        reload_times: [None; 2],
        tracked: crate::daemon::spawn_tracker(limiter_map_id, Duration::from_secs(2)),
        top: crate::top::Tracker::default(),
        drop_events: None,
        ebpf_log: None,
        last_tick: None,
    };
    d.drop_events = d.limiter.take_drop_events();
    d.ebpf_log = d.limiter.take_logger();
    // Policy first, then attach: the program never runs without one.
    let summary = first_apply(&mut d, args, policy)?;
    let (link, replaced) = if args.pin {
        (None, d.limiter.attach_pinned(&args.iface, args.mode, &args.pin_dir)?)
    } else {
        (Some(d.limiter.attach(&args.iface, args.mode)?), false)
    };
    announce(args, &d, &summary, adopted, replaced);
    let (calls_tx, mut calls) = tokio::sync::mpsc::channel(16);
    crate::control::server::listen(socket, access, calls_tx)?;
    tracing::info!("limiter: control socket {} (mode 0660)", socket.display());
    let (scrape_tx, mut scrapes) = tokio::sync::mpsc::channel::<crate::metrics::ScrapeCall>(4);
    if let Some(addr) = metrics_addr {
        // Metrics are an aid; a busy port must not leave the interface unprotected.
        match crate::metrics::serve(addr, scrape_tx).await {
            Ok(bound) => tracing::info!("limiter: metrics on http://{bound}/metrics"),
            Err(e) => tracing::info!("limiter: warning: metrics not served on {addr}: {e}"),
        }
    }
    notify_ready();

    let period = Duration::from_secs_f64(if args.status_interval > 0.0 { args.status_interval } else { 3600.0 });
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let (mut last, mut last_at) = (d.limiter.totals()?, Instant::now());
    let mut drain = tokio::time::interval(Duration::from_millis(200));
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let why = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => reload(args, &mut d),
            Some((req, reply)) = calls.recv() => {
                let response = d.handle(req, || args.load_policy().map(|p| (p, source_name(args))));
                if let crate::control::Response::Applied { summary, .. } = &response {
                    tracing::info!(event = "policy_change", version = d.version, "limiter: applied {summary}");
                }
                let _ = reply.send(response);
            }
            _ = drain.tick() => d.drain_drop_events(),
            _ = second.tick() => d.tick_second()?,
            Some(reply) = scrapes.recv() => {
                if let Ok(s) = d.snapshot() {
                    let _ = reply.send(s);
                }
            }
            _ = tick.tick(), if args.status_interval > 0.0 => {
                let now = d.limiter.totals()?;
                let status = status_line(&now, &last, last_at.elapsed(), d.tracked(), capacity);
                tracing::info!(event = "status", version = d.version, "{status} policy v{}", d.version);
                (last, last_at) = (now, Instant::now());
            }
        }
    };
    let _ = std::fs::remove_file(socket);
    stop(args, &mut d, link, why)
}

/// Apply the first policy: the file's (or the built-in one), with the
/// overrides a previous daemon set at run time put back over it (they are
/// part of the policy the pinned data plane enforces).
fn first_apply(d: &mut Daemon, args: &RunArgs, policy: Policy) -> anyhow::Result<String> {
    let restored = d.restore_runtime_overrides()?;
    if restored > 0 {
        tracing::info!(
            "limiter: {restored} runtime override(s) put back from {} (`limiter prefix list` shows them)",
            args.pin_dir.join(limiter_common::maps::RUNTIME).display()
        );
    }
    match d.apply(policy, source_name(args)) {
        Ok(s) => Ok(s),
        Err(e) if restored > 0 => anyhow::bail!(
            "{e} (the policy with {restored} runtime override(s) put back from the pins; the pinned program keeps enforcing the last policy)"
        ),
        Err(e) => Err(e.into()),
    }
}

/// The lines printed once the program is attached.
fn announce(args: &RunArgs, d: &Daemon, summary: &str, adopted: bool, replaced: bool) {
    let capacity = d.capacity;
    tracing::info!(
        event = "attach",
        iface = %args.iface,
        mode = args.mode.label(),
        version = d.version,
        capacity,
        "limiter: attached to {} ({}), {summary}, capacity {capacity}",
        args.iface,
        args.mode.label()
    );
    if args.pin {
        tracing::info!(
            "limiter: pinned in {}; {}; {}",
            args.pin_dir.display(),
            if adopted { "re-adopted pinned maps (buckets and counters kept)" } else { "new maps" },
            if replaced { "replaced the program on the pinned link atomically" } else { "new link" },
        );
        if capacity != d.base.capacity {
            tracing::info!(
                "limiter: capacity stays {capacity} (pinned map); `limiter unload` and restart to change it"
            );
        }
    }
}

/// Detach (or leave pinned) and print the totals.
fn stop(args: &RunArgs, d: &mut Daemon, link: Option<aya::programs::xdp::XdpLinkId>, why: &str) -> anyhow::Result<()> {
    let t = d.limiter.totals()?;
    let (passed, dropped) = (t.passed().packets, t.dropped().packets);
    if let Some(link) = link {
        d.limiter.detach(link)?;
        tracing::info!(
            event = "detach",
            iface = %args.iface,
            signal = why,
            passed,
            dropped,
            "limiter: {why}: detached from {}; passed {passed} dropped {dropped} packets in total",
            args.iface
        );
    } else {
        tracing::info!(
            "limiter: {why}: stopping; XDP stays attached to {} and enforcing (pinned in {}; `limiter unload` removes it); passed {passed} dropped {dropped} packets in total",
            args.iface,
            args.pin_dir.display()
        );
    }
    Ok(())
}

fn source_name(args: &RunArgs) -> String {
    args.policy_source().map_or_else(|| "built-in policy".to_owned(), |p| p.display().to_string())
}

/// SIGHUP: re-read and apply the policy as the next version, all or
/// nothing. A rejected policy is reported and the running one stays.
fn reload(args: &RunArgs, d: &mut Daemon) {
    let source = source_name(args);
    let result = args.load_policy().map_err(ApplyError::from).and_then(|p| d.apply(p, source.clone()));
    match result {
        Ok(summary) => {
            tracing::info!(event = "reload", ok = true, version = d.version, source = %source, "limiter: SIGHUP: applied {source}: {summary}");
            d.note_reload(true, summary);
        }
        Err(e) => {
            let message = format!("rejected {source}: {e}; policy v{} keeps running", d.version);
            tracing::warn!(event = "reload", ok = false, version = d.version, source = %source, "limiter: SIGHUP: {message}");
            d.note_reload(false, message);
        }
    }
}

/// Tell systemd (`Type=notify`) the data plane is enforcing and the
/// socket is up: one `READY=1` datagram to `$NOTIFY_SOCKET`, if set.
fn notify_ready() {
    use std::os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    // A leading '@' names an abstract socket.
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name),
        None => std::os::unix::net::SocketAddr::from_pathname(&path),
    };
    if let Ok(addr) = addr {
        let _ = sock.send_to_addr(b"READY=1\n", &addr);
    }
}

/// A group name or number to a gid.
fn resolve_group(g: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = g.parse() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(g)?;
    // SAFETY: getgrnam with a valid C string; we copy gr_gid out at once.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    anyhow::ensure!(!gr.is_null(), "socket group {g:?} does not exist");
    // SAFETY: non-null result of getgrnam.
    Ok(unsafe { (*gr).gr_gid })
}

/// One line about a policy.
#[must_use]
pub fn describe(p: &Policy, version: u64) -> String {
    let d = p.default;
    let mut s = format!(
        "policy v{version}: rate {} {}/s burst {} per IPv4 /{} and IPv6 /{} ({})",
        d.rate,
        d.cost.label(),
        d.burst,
        p.v4_prefix,
        p.v6_prefix,
        d.mode.label()
    );
    for c in &p.classes {
        let l = c.limit;
        let _ = write!(s, "; class {}: rate {} burst {} ({})", c.name, l.rate, l.burst, l.mode.label());
    }
    if let Some((rate, burst)) = p.new_sources {
        let _ = write!(s, "; new sources {rate}/s burst {burst}");
    }
    if let Some(a) = p.aggregate {
        let _ = write!(s, "; aggregate /{} and /{}: rate {} burst {}", a.v4_prefix, a.v6_prefix, a.rate, a.burst);
    }
    if !p.overrides.is_empty() {
        let _ = write!(s, "; {} overrides", p.overrides.len());
    }
    s
}

/// `passed P (r/s) dropped D (r/s) tracked N/CAP`, plus nonzero drop reasons.
#[must_use]
pub fn status_line(now: &Totals, last: &Totals, dt: Duration, tracked: usize, capacity: u32) -> String {
    let d = now.since(last);
    let secs = dt.as_secs_f64().max(1e-9);
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let rate = |n: u64| n as f64 / secs;
    let mut line = format!(
        "passed {} ({:.0}/s) dropped {} ({:.0}/s) tracked {tracked}/{capacity}",
        now.passed().packets,
        rate(d.passed().packets),
        now.dropped().packets,
        rate(d.dropped().packets),
    );
    for r in limiter_common::Reason::ALL {
        let c = now.get(r);
        if (r.verdict() == limiter_common::Verdict::Drop || r == limiter_common::Reason::ShadowDropped) && c.packets > 0
        {
            let _ = write!(line, " {}={}", r.label(), c.packets);
        }
    }
    line
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it.
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall on a valid struct; failure only matters on old kernels.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) };
}
