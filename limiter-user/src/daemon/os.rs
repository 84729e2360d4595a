//! The daemon's glue to the operating system: logging, systemd readiness,
//! group lookup, resource limits.

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

/// Tell systemd (`Type=notify`) the data plane is enforcing and the
/// socket is up: one `READY=1` datagram to `$NOTIFY_SOCKET`, if set.
pub fn notify_ready() {
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
pub fn resolve_group(g: &str) -> anyhow::Result<u32> {
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

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it.
pub fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain syscall on a valid struct; failure only matters on old kernels.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) };
}

/// Whether the kernel in this network namespace takes the ACKs of SYN
/// cookies sent from XDP: it checks them itself only with
/// `net.ipv4.tcp_syncookies = 2` (cookies always, so the SYNs the program
/// hands it keep the listener in its cookie state). `Err` says why not.
pub fn syn_cookies_ready() -> Result<(), CookiesUnready> {
    match std::fs::read_to_string(SYNCOOKIES_SYSCTL) {
        Ok(v) if v.trim() == "2" => Ok(()),
        Ok(v) => Err(CookiesUnready::Sysctl(v.trim().to_owned())),
        Err(e) => Err(CookiesUnready::Unreadable(e)),
    }
}

const SYNCOOKIES_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_syncookies";

/// Why the kernel would not take the ACKs of cookies sent from XDP.
#[derive(Debug, thiserror::Error)]
pub enum CookiesUnready {
    #[error(
        "net.ipv4.tcp_syncookies is {0} in this network namespace; the kernel accepts the ACKs of cookies sent \
         from XDP only with 2 (sysctl -w net.ipv4.tcp_syncookies=2)"
    )]
    Sysctl(String),
    #[error("cannot read {SYNCOOKIES_SYSCTL} (a kernel without CONFIG_SYN_COOKIES?): {0}")]
    Unreadable(std::io::Error),
}

/// What a cookie's SYN-ACK may offer beside the MSS on this host, from
/// the sysctls of this network namespace: `(opts, wscale, why MSS only)`
/// ([`limiter_common::cookie::opt`]). The kernel reads window scaling and
/// SACK back from the timestamp echo, and first subtracts a secret
/// per-connection offset unless `net.ipv4.tcp_timestamps = 2`: with 1 (the
/// default) the SYN-ACK offers the MSS only. The window scale offered is
/// the one the kernel will take for the connection (`tcp_select_initial_window`:
/// the largest of `tcp_rmem`'s maximum and `net.core.rmem_max`).
#[must_use]
pub fn cookie_options() -> (u8, u8, Option<String>) {
    use limiter_common::cookie::{MAX_WSCALE, opt};
    let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/{name}")).ok();
    let number = |name: &str, field: usize| {
        read(name).and_then(|v| v.split_whitespace().nth(field).and_then(|f| f.parse::<u64>().ok()))
    };
    let timestamps = number("ipv4/tcp_timestamps", 0).unwrap_or(0);
    if timestamps != 2 {
        let why = format!(
            "net.ipv4.tcp_timestamps is {timestamps}: SYN-ACKs of cookies offer the MSS only (2, timestamps without \
             per-connection offsets, lets them carry window scaling, SACK and timestamps)"
        );
        return (0, 0, Some(why));
    }
    let mut opts = opt::TIMESTAMPS;
    if number("ipv4/tcp_sack", 0).is_some_and(|v| v != 0) {
        opts |= opt::SACK;
    }
    if number("ipv4/tcp_window_scaling", 0).is_some_and(|v| v != 0) {
        opts |= opt::WSCALE;
    }
    let space =
        number("ipv4/tcp_rmem", 2).unwrap_or(0).max(number("core/rmem_max", 0).unwrap_or(0)).min(u64::from(u32::MAX));
    let wscale = u8::try_from(space.max(1).ilog2().saturating_sub(15)).unwrap_or(MAX_WSCALE).min(MAX_WSCALE);
    (opts, wscale, None)
}
