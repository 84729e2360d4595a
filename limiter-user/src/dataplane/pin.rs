//! Pinning under bpffs, so the data plane outlives the daemon (invariant 5,
//! docs/design.md).
//!
//! Layout of a pin directory (default [`DEFAULT_PIN_DIR`]):
//! `BUCKETS`, `WINDOWS`, `CONFIG`, `STATS`, `META`, `RUNTIME` (the overrides set at
//! run time) and the other maps of [`PINNED_MAPS`], `prog` (the program) and
//! `link` (the XDP link). What a restarted daemon re-adopts, renews or
//! refuses of what it finds there is [`super::upgrade`]'s.

use std::{
    ffi::CString,
    fs::File,
    io,
    path::{Path, PathBuf},
};

use aya::maps::MapType;
use limiter_common::maps;

/// Default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/limiter";
/// Maps pinned with the program, the pinned rows of
/// [`limiter_common::maps::TABLE`] (name, type, key and value size, and
/// the schema in which the map's layout or meaning last changed). A pinned
/// map is re-adopted when its type, sizes and number of entries are this
/// build's and the schema that pinned it is at least that one; otherwise
/// an upgrade renews it (see [`super::upgrade::plan`]).
pub const PINNED_MAPS: [PinnedMap; maps::PINNED] = {
    let mut out = [PinnedMap::new("", MapType::Unspecified, 0, 0, None, 0); maps::PINNED];
    let (mut i, mut n) = (0, 0);
    while i < maps::TABLE.len() {
        let m = maps::TABLE[i];
        if let Some(since) = m.pinned {
            let entries = if m.by_capacity { None } else { Some(m.entries) };
            out[n] = PinnedMap::new(m.name, map_type(m.kind), m.key, m.value, entries, since);
            n += 1;
        }
        i += 1;
    }
    out
};

/// The kernel's map type of a [`maps::Kind`].
#[must_use]
pub const fn map_type(kind: maps::Kind) -> MapType {
    match kind {
        maps::Kind::Hash => MapType::Hash,
        maps::Kind::LruHash => MapType::LruHash,
        maps::Kind::Array => MapType::Array,
        maps::Kind::PerCpuArray => MapType::PerCpuArray,
        maps::Kind::LpmTrie => MapType::LpmTrie,
        maps::Kind::RingBuf => MapType::RingBuf,
    }
}

/// One row of [`PINNED_MAPS`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PinnedMap {
    pub name: &'static str,
    pub kind: MapType,
    /// Key and value sizes in bytes.
    pub key: usize,
    pub value: usize,
    /// Max entries as this build declares them; `None` for the maps sized
    /// by the policy's capacity, whose pinned size is kept whatever it is.
    pub entries: Option<u32>,
    /// The schema in which its layout or meaning last changed.
    pub since: u32,
}

impl PinnedMap {
    const fn new(
        name: &'static str,
        kind: MapType,
        key: usize,
        value: usize,
        entries: Option<u32>,
        since: u32,
    ) -> Self {
        Self { name, kind, key, value, entries, since }
    }
}

/// Maps earlier schemas pinned that this build has not: their pins are
/// removed once this build's program is on the link (the old program
/// used them until then), and by `limiter unload`. A rollback to a build
/// that has them makes them again ("missing").
pub const RETIRED_MAPS: [&str; 1] = [maps::CLASS_STATS];
/// File names of the pinned link and program inside the pin directory.
pub const LINK: &str = "link";
pub const PROG: &str = "prog";
/// Suffix of a renewed map's pin until the new program is on the link
/// (then it is renamed over the old pin). Not a dot: bpffs keeps names
/// with dots for itself.
pub const NEW_SUFFIX: &str = "-new";

/// Where the renewal of the pinned map `name` is pinned until it is put in
/// place.
#[must_use]
pub fn new_pin(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{NEW_SUFFIX}"))
}

/// Remove what an interrupted upgrade left: pins of renewed maps made
/// before the new program was on the link (the old pins still hold the
/// state the old program uses).
pub fn remove_unfinished(dir: &Path) {
    for PinnedMap { name, .. } in PINNED_MAPS {
        let _ = std::fs::remove_file(new_pin(dir, name));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "{path} is not on a bpf filesystem in this mount namespace, which is not the host's (started with `ip netns exec`?): pins made here would vanish with the process; use `nsenter --net=/run/netns/NAME` or mount bpffs in the host namespace"
    )]
    PrivateMounts { path: PathBuf },
    #[error(
        "the limiter's dispatcher component (program {id}) is on an interface of another network namespace: run `limiter unload` in that namespace (for example `nsenter --net=/run/netns/NAME limiter unload ...`); nothing was removed"
    )]
    ComponentElsewhere { id: u32 },
    #[error("{path} is in use by another running limiter daemon (it holds the directory's lock)")]
    InUse { path: PathBuf },
    #[error("locking {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mounting bpffs at {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not on a bpf filesystem")]
    NotBpffs { path: PathBuf },
    #[error("creating {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("opening pinned {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(
        "pinned map {path} is incompatible with this limiter ({problem}); refusing to reuse it: run `limiter unload` to remove the old state"
    )]
    Incompatible { path: PathBuf, problem: String },
    #[error("putting the renewed map in place at {path}")]
    Rename {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether this process has a mount namespace of its own, as under `ip
/// netns exec` (which unshares it in place, then execs): a bpffs mounted
/// there dies with the process. Compared with PID 1's, or, where that is
/// hidden (a container), with the parent's.
fn private_mount_namespace() -> bool {
    let ns = |p: &str| std::fs::read_link(p).ok();
    let Some(own) = ns("/proc/self/ns/mnt") else { return false };
    let parent = std::os::unix::process::parent_id();
    ns("/proc/1/ns/mnt").or_else(|| ns(&format!("/proc/{parent}/ns/mnt"))).is_some_and(|other| other != own)
}

/// Make sure `dir` exists on a bpffs, mounting one at /sys/fs/bpf if the
/// machine has none (it is not mounted by default everywhere). In a mount
/// namespace of its own nothing is mounted: pins there would not outlive
/// the process, and the daemon would claim protection that is not there.
pub fn ensure_dir(dir: &Path) -> Result<(), PinError> {
    let root = Path::new("/sys/fs/bpf");
    if dir.starts_with(root) && !is_bpffs(root) {
        if private_mount_namespace() {
            return Err(PinError::PrivateMounts { path: root.into() });
        }
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (src, target, fstype) = (c("bpf"), c("/sys/fs/bpf"), c("bpf"));
        // SAFETY: valid NUL-terminated strings; no data argument.
        let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
        if rc != 0 {
            return Err(PinError::Mount { path: root.into(), source: io::Error::last_os_error() });
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| PinError::Dir { path: dir.into(), source })?;
    if !is_bpffs(dir) {
        return Err(PinError::NotBpffs { path: dir.into() });
    }
    Ok(())
}

fn is_bpffs(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &raw mut st) };
    #[allow(clippy::useless_conversion, reason = "f_type is i64 on x86_64 but not on every architecture")]
    let f_type = i64::from(st.f_type);
    rc == 0 && f_type == BPF_FS_MAGIC
}

/// Whether anything is pinned in `dir`.
#[must_use]
pub fn has_pins(dir: &Path) -> bool {
    PINNED_MAPS.iter().any(|m| dir.join(m.name).exists()) || dir.join(LINK).exists()
}

/// Take an exclusive, non-blocking `flock` on `path` (a directory, or a
/// lock file made if `create`). `Err(None)`: another process holds it.
pub fn lock_exclusive(path: &Path, create: bool) -> Result<File, Option<io::Error>> {
    use std::os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _};
    let file = if create {
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(path)
    } else {
        File::open(path)
    }
    .map_err(Some)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err((e.kind() != io::ErrorKind::WouldBlock).then_some(e));
    }
    Ok(file)
}

/// Lock a pin directory for this process (held while the file lives): one
/// daemon per pin directory, and `limiter unload` knows when one runs.
pub fn lock_dir(dir: &Path) -> Result<File, PinError> {
    lock_exclusive(dir, false).map_err(|e| match e {
        Some(source) => PinError::Lock { path: dir.into(), source },
        None => PinError::InUse { path: dir.into() },
    })
}

/// Why `limiter unload` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum UnloadError {
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(
        "a running limiter daemon serves {dir}; stop it first (it re-attaches what is removed under it), or use --force"
    )]
    DaemonRunning { dir: PathBuf },
}

/// `limiter unload`: refuse while a daemon serves `dir` unless `force`,
/// and say so when `dir` is not on bpffs here (rather than "nothing
/// pinned" about pins this mount namespace cannot see). Returns what was
/// removed, and whether the maps were kept for a running daemon.
pub fn unload_checked(dir: &Path, keep_maps: bool, force: bool) -> Result<(Vec<String>, bool), UnloadError> {
    let root = Path::new("/sys/fs/bpf");
    let on_bpffs = is_bpffs(dir) || (dir.starts_with(root) && is_bpffs(root));
    if !on_bpffs {
        return Err(if private_mount_namespace() {
            PinError::PrivateMounts { path: dir.into() }
        } else {
            PinError::NotBpffs { path: dir.into() }
        }
        .into());
    }
    let (_lock, live) = match lock_dir(dir) {
        Ok(l) => (Some(l), false),
        Err(PinError::InUse { .. }) if !force => return Err(UnloadError::DaemonRunning { dir: dir.into() }),
        Err(PinError::InUse { .. }) => (None, true),
        // Nothing there to lock (nothing pinned).
        Err(PinError::Lock { .. }) => (None, false),
        Err(e) => return Err(e.into()),
    };
    // Forced past a running daemon: its maps and the directory are what it
    // needs to put its program back, so they stay whatever was asked
    // (removing them left the interface unprotected behind a daemon that
    // could pin nothing again); the link and program go, and the daemon
    // attaches and pins them again within a second.
    Ok((unload(dir, keep_maps || live)?, live && !keep_maps))
}

/// Remove the pinned link and program (detaching it), and the maps unless
/// `keep_maps`. Returns what was removed.
pub fn unload(dir: &Path, keep_maps: bool) -> Result<Vec<String>, PinError> {
    let prog = dir.join(PROG);
    if prog.exists() {
        match super::chain::leave_pinned(&prog) {
            super::chain::Left::Left(iface) => {
                tracing::info!("limiter: the limiter's component left {iface}'s dispatcher");
            }
            // Its pins removed, libxdp's own would keep it running, alone
            // and unmanaged: refused whole.
            super::chain::Left::Elsewhere(id) => return Err(PinError::ComponentElsewhere { id }),
            super::chain::Left::NotComponent => {}
        }
    }
    let mut names = vec![LINK, PROG];
    if !keep_maps {
        names.extend(PINNED_MAPS.iter().map(|m| m.name));
        names.extend(RETIRED_MAPS);
        remove_unfinished(dir);
    }
    let mut removed = Vec::new();
    for n in names {
        let path = dir.join(n);
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(n.to_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(PinError::Remove { path, source }),
        }
    }
    if !keep_maps {
        // Only if empty: never remove what we did not pin.
        let _ = std::fs::remove_dir(dir);
    }
    Ok(removed)
}
