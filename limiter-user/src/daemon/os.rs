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
