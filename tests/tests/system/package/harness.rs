//! The package tests' tools: the packages built once, commands that must
//! succeed, and the package installed under one lock for the length of a
//! test.

use super::*;

pub(super) fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(super) fn ok(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let o = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        o.status.success(),
        "{shown}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

pub(super) fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&ok(cmd).stdout).into_owned()
}

/// The packages of revisions 1 and 2, built once by `cargo xtask package`
/// (the second from the same tree: an upgrade's "version N+1").
pub(super) fn debs() -> &'static (PathBuf, PathBuf) {
    static DEBS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DEBS.get_or_init(|| {
        let _lock = Lock::take();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let build = |revision: &str| {
            let out = stdout(Command::new(&cargo).current_dir(workspace()).args([
                "xtask",
                "package",
                "--revision",
                revision,
            ]));
            let deb = workspace().join(out.lines().last().expect("the package's path"));
            assert!(deb.is_file(), "{} not built", deb.display());
            deb
        };
        (build("1"), build("2"))
    })
}

pub(super) fn field(deb: &Path, name: &str) -> String {
    stdout(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(name)).trim().to_owned()
}

/// An exclusive lock shared by every process of these tests (nextest runs
/// each test in its own): building the packages and installing them.
pub(super) struct Lock(#[allow(dead_code, reason = "held for its lock")] std::fs::File);

impl Lock {
    pub(super) fn take() -> Self {
        let f = std::fs::File::create(std::env::temp_dir().join("limiter-package-tests.lock")).unwrap();
        // SAFETY: flock(2) on a descriptor we own; released when it closes.
        assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) }, 0);
        Self(f)
    }
}

/// The package installed for the length of a test: purged on drop.
pub(super) struct Installed(#[allow(dead_code, reason = "held for its lock")] Lock);

impl Installed {
    pub(super) fn new(deb: &Path) -> Self {
        let lock = Lock::take();
        require_root();
        let state = Command::new("dpkg-query").args(["-W", "-f=${Status}", "limiter"]).output().unwrap();
        let state = String::from_utf8_lossy(&state.stdout).into_owned();
        assert!(
            !state.contains("installed") && !state.contains("config-files"),
            "a limiter package is already on this machine ({state}); purge it (dpkg -P limiter) to run these tests"
        );
        assert!(!Path::new("/etc/limiter").exists(), "/etc/limiter exists: this test would take it over");
        let this = Self(lock);
        dpkg(&["-i"], deb);
        this
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["-P", "limiter"]).output();
    }
}

pub(super) fn dpkg(args: &[&str], deb: &Path) -> String {
    stdout(Command::new("dpkg").args(args).arg(deb).env("DEBIAN_FRONTEND", "noninteractive"))
}

pub(super) fn dpkg_status() -> String {
    let o = Command::new("dpkg-query").args(["-W", "-f=${Status} ${Version}", "limiter"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}
