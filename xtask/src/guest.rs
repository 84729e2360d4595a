//! The guest tier: boot a distribution's stock kernel in a QEMU guest and
//! run host-built binaries there.
//!
//! The kernel comes from the distribution's package registry
//! (`apt-get download`, `dpkg-deb -x` under `target/vm/`; never installed
//! on the host). Each run builds a small initramfs (static busybox,
//! `guest/init.sh` as `/init`, the kernel's virtio, 9p and overlay
//! modules), boots QEMU with the host's `/` shared read-only over 9p under
//! a tmpfs overlay, runs one bash command as PID 1's child in the caller's
//! working directory, and hands back its exit status through a second,
//! writable 9p share; the guest then ends QEMU through `isa-debug-exit`.
//! Nothing is compiled in the guest: TCG runs CPU-bound work 4-17x slower
//! than the host (KVM does not boot a guest on these machines).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

mod initramfs;
use self::initramfs::initramfs;

/// QEMU, the initramfs's tools and the kernel modules' tools.
pub const PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "cpio", "kmod", "xz-utils", "zstd"];

/// A distribution kernel the tier boots: Debian's `linux-image-amd64` of
/// one release, whatever version that release points it at today.
#[derive(Clone, Copy)]
pub struct Release {
    /// Debian's codename (the apt suite).
    pub codename: &'static str,
    /// How the tier names it.
    pub label: &'static str,
}

/// The kernels users run: Debian 12's (6.1) and Debian 13's (6.12).
pub const RELEASES: &[Release] =
    &[Release { codename: "bookworm", label: "Debian 12" }, Release { codename: "trixie", label: "Debian 13" }];

/// A kernel older than the oldest supported (Debian 11's 5.10): the tier
/// checks that the daemon refuses it in one line.
pub const OLDER: Release = Release { codename: "bullseye", label: "Debian 11" };

/// An extracted kernel image with its modules.
pub struct Kernel {
    /// `uname -r` in the guest, e.g. `6.1.0-57-amd64`.
    pub version: String,
    /// Where the package was extracted (`boot/`, `lib/modules/`).
    pub dir: PathBuf,
}

/// Download and extract `release`'s stock kernel under `target/vm/`
/// (kept: a second run of the same version downloads nothing).
pub fn fetch(release: Release) -> anyhow::Result<Kernel> {
    let root = std::env::current_dir()?.join("target/vm").join(release.codename);
    let apt = root.join("apt");
    for d in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    std::fs::write(apt.join("sources.list"), sources_for(release.codename)?)?;
    let opts = [
        format!("Dir::Etc::sourcelist={}", apt.join("sources.list").display()),
        "Dir::Etc::sourceparts=/dev/null".into(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
    ];
    let apt_cmd = |tool: &str| {
        let mut c = Command::new(tool);
        for o in &opts {
            c.arg("-o").arg(o);
        }
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    let mut update = apt_cmd("apt-get");
    update.args(["update", "-qq"]);
    crate::run(update).with_context(|| format!("apt-get update for {}", release.codename))?;
    let out = apt_cmd("apt-cache").args(["depends", "linux-image-amd64"]).output()?;
    let deps = String::from_utf8_lossy(&out.stdout);
    let pkg = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && p.as_bytes().get(12).is_some_and(u8::is_ascii_digit))
        .with_context(|| format!("{}: linux-image-amd64 names no kernel package:\n{deps}", release.codename))?
        .to_owned();
    let version = pkg.trim_start_matches("linux-image-").to_owned();
    let dir = root.join(&version);
    if !dir.join("boot").join(format!("vmlinuz-{version}")).is_file() {
        let dl = root.join("download");
        let _ = std::fs::remove_dir_all(&dl);
        std::fs::create_dir_all(&dl)?;
        let mut get = apt_cmd("apt-get");
        get.args(["download", "-qq", &pkg]).current_dir(&dl);
        crate::run(get)?;
        let deb = std::fs::read_dir(&dl)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download {pkg} left no .deb"))?;
        let _ = std::fs::remove_dir_all(&dir);
        let mut x = Command::new("dpkg-deb");
        x.arg("-x").arg(&deb).arg(&dir);
        crate::run(x)?;
        std::fs::remove_dir_all(&dl)?;
    }
    // Merged /usr (Debian 13): the modules are under usr/lib only.
    if !dir.join("lib").exists() && dir.join("usr/lib/modules").is_dir() {
        std::os::unix::fs::symlink("usr/lib", dir.join("lib"))?;
    }
    let mut depmod = Command::new("depmod");
    depmod.arg("-b").arg(&dir).arg(&version);
    crate::run(depmod)?;
    Ok(Kernel { version, dir })
}

/// An apt sources list for `codename` made from the host's own (same
/// mirrors, same components), in the one-line format.
fn sources_for(codename: &str) -> anyhow::Result<String> {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let host = os
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|s| s.trim_matches('"').to_owned())
        .context("/etc/os-release has no VERSION_CODENAME")?;
    let mut entries: Vec<(String, String, String)> = Vec::new();
    // deb822 (.sources) stanzas, then one-line .list files.
    let mut files: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.insert(0, "/etc/apt/sources.list".into());
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        if f.extension().is_some_and(|e| e == "sources") {
            for stanza in text.split("\n\n") {
                let field = |k: &str| {
                    stanza.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')).map(|v| v.trim().to_owned())
                };
                if field("Types").is_some_and(|t| !t.split_whitespace().any(|t| t == "deb")) {
                    continue;
                }
                let (Some(uris), Some(suites), Some(comps)) = (field("URIs"), field("Suites"), field("Components"))
                else {
                    continue;
                };
                for uri in uris.split_whitespace() {
                    for suite in suites.split_whitespace() {
                        entries.push((uri.to_owned(), suite.to_owned(), comps.clone()));
                    }
                }
            }
        } else {
            for l in text.lines() {
                let w: Vec<&str> = l.split_whitespace().filter(|w| !w.starts_with('[')).collect();
                if w.len() >= 4 && w[0] == "deb" {
                    entries.push((w[1].to_owned(), w[2].to_owned(), w[3..].join(" ")));
                }
            }
        }
    }
    let mut out = String::new();
    for (uri, suite, comps) in entries {
        // The host's suites named after its release, moved to `codename`
        // (bookworm-security -> trixie-security); others are left out.
        let Some(rest) = suite.strip_prefix(host.as_str()) else { continue };
        let _ = writeln!(out, "deb {uri} {codename}{rest} {comps}");
    }
    if out.is_empty() {
        bail!("no apt source of the host ({host}) to derive {codename}'s from");
    }
    Ok(out)
}

/// The first line of every guest command, which says it booted.
const UP: &str = "guest: up";
/// A guest not up by then hung booting (seen under TCG): it is ended.
const BOOT_TIMEOUT: Duration = Duration::from_mins(2);

/// How a guest run ended.
pub struct Outcome {
    /// The command's exit status, if the guest reported one.
    pub status: Option<i32>,
    pub timed_out: bool,
}

/// Boot `k` and run `command` (a bash command line) in the guest, in the
/// current directory, each line of its output handed to `line` as it
/// comes.
pub fn run(k: &Kernel, command: &str, timeout: Duration, mut line: impl FnMut(&str)) -> anyhow::Result<Outcome> {
    let work = tempdir()?;
    let result = (|| {
        let io = work.join("io");
        std::fs::create_dir_all(&io)?;
        let initrd = work.join("initrd.cpio");
        initramfs(k, &work, &initrd)?;
        let cwd = std::env::current_dir()?;
        std::fs::write(io.join("cmd.sh"), script(&cwd, command))?;
        // What the guest keeps (logs of what failed): /run/guest-out there,
        // a directory a kernel.
        let out_dir = cwd.join("target/guest-out").join(&k.version);
        std::fs::create_dir_all(&out_dir)?;
        let mut child = qemu(k, &initrd, &io, &out_dir).spawn().context("starting qemu-system-x86_64")?;
        let done = Arc::new(AtomicBool::new(false));
        let timed_out = Arc::new(AtomicBool::new(false));
        let up = Arc::new(AtomicBool::new(false));
        let rc_file = io.join("rc");
        let watch = watchdog(child.id(), timeout, &done, &timed_out, &up, &rc_file);
        let stderr = child.stderr.take().context("stderr")?;
        let err = std::thread::spawn(move || {
            BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>().join("\n")
        });
        let out = child.stdout.take().context("stdout")?;
        for l in BufReader::new(out).split(b'\n').map_while(Result::ok) {
            let l = String::from_utf8_lossy(&l);
            let l = l.trim_end_matches('\r');
            if l == UP {
                up.store(true, Ordering::Relaxed);
                continue;
            }
            line(l);
        }
        let st = child.wait()?;
        done.store(true, Ordering::Relaxed);
        let _ = watch.join();
        let qemu_err = err.join().unwrap_or_default();
        let status = std::fs::read_to_string(&rc_file).ok().and_then(|s| s.trim().parse().ok());
        if !up.load(Ordering::Relaxed) {
            bail!(
                "the guest ({}) did not boot: its command never started (QEMU ended with {st}, or was ended after {} s; LIMITER_GUEST_VERBOSE=1 shows the kernel's log) {qemu_err}",
                k.version,
                BOOT_TIMEOUT.as_secs()
            );
        }
        if status.is_none() && !timed_out.load(Ordering::Relaxed) {
            bail!("the guest ({}) reported no exit status; qemu {st}: {qemu_err}", k.version);
        }
        Ok(Outcome { status, timed_out: timed_out.load(Ordering::Relaxed) })
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The guest's `cmd.sh`: the caller's environment that matters, the
/// boot marker, the working directory, the command.
fn script(cwd: &Path, command: &str) -> String {
    let mut script = String::from("#!/bin/bash\n");
    for var in ["PATH", "HOME", "RUST_BACKTRACE", "RUST_LOG", "CI"] {
        if let Ok(v) = std::env::var(var) {
            let _ = writeln!(script, "export {var}={}", sh_quote(Path::new(&v)));
        }
    }
    let _ = writeln!(script, "echo {UP}");
    let _ = writeln!(script, "cd {} || exit 126", sh_quote(cwd));
    script.push_str(command);
    script.push('\n');
    script
}

/// QEMU for `k`: TCG, 2 vCPUs, the host's root and the io and out
/// shares over 9p, the serial console on stdout, isa-debug-exit.
fn qemu(k: &Kernel, initrd: &Path, io: &Path, out_dir: &Path) -> Command {
    let mem = std::env::var("LIMITER_GUEST_MEM").unwrap_or_else(|_| "4G".into());
    let verbose = std::env::var_os("LIMITER_GUEST_VERBOSE").is_some();
    let append = format!(
        "console=ttyS0 panic=-1 {} rdinit=/init guest.kver={} guest.kdir={} guest.upper=60%",
        if verbose { "loglevel=7" } else { "quiet loglevel=1" },
        k.version,
        k.dir.display()
    );
    // q35: microvm booted Debian 13's kernel one time in three at best
    // under TCG (it hangs calibrating the TSC).
    let machine = std::env::var("LIMITER_GUEST_MACHINE").unwrap_or_else(|_| "q35".into());
    let dev = if machine.starts_with("microvm") { "virtio-9p-device" } else { "virtio-9p-pci" };
    let share = |id: &str, path: &Path, ro: bool| {
        [
            "-fsdev".to_owned(),
            format!(
                "local,id={id},path={},security_model=none{}",
                path.display(),
                if ro { ",readonly=on,multidevs=remap" } else { "" }
            ),
            "-device".to_owned(),
            format!("{dev},fsdev={id},mount_tag={id}"),
        ]
    };
    let mut q = Command::new("qemu-system-x86_64");
    q.args(["-M", &machine, "-accel", "tcg,thread=multi", "-cpu", "max"])
        .args(["-smp", "2", "-m", &mem, "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none"])
        .args(["-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"])
        .arg("-kernel")
        .arg(k.dir.join("boot").join(format!("vmlinuz-{}", k.version)))
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &append])
        .args(share("hostroot", Path::new("/"), true))
        .args(share("guestio", io, false))
        .args(share("guestout", out_dir, false))
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    q
}

/// Ends QEMU (`pid`) when the run is over its time, when the guest has
/// not come up within [`BOOT_TIMEOUT`], or 5 s after the guest reported
/// its status without ending QEMU itself.
fn watchdog(
    pid: u32,
    timeout: Duration,
    done: &Arc<AtomicBool>,
    timed_out: &Arc<AtomicBool>,
    up: &Arc<AtomicBool>,
    rc_file: &Path,
) -> std::thread::JoinHandle<()> {
    let (done, timed_out, up, rc_file) = (done.clone(), timed_out.clone(), up.clone(), rc_file.to_path_buf());
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut reported: Option<Instant> = None;
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            if reported.is_none() && rc_file.exists() {
                reported = Some(Instant::now());
            }
            let late = reported.is_some_and(|r| r.elapsed() > Duration::from_secs(5));
            let hung = !up.load(Ordering::Relaxed) && start.elapsed() > BOOT_TIMEOUT;
            if start.elapsed() > timeout || late || hung {
                timed_out.store(start.elapsed() > timeout, Ordering::Relaxed);
                #[expect(clippy::cast_possible_wrap, reason = "a pid fits an i32")]
                // SAFETY: kill has no memory preconditions; pid is our
                // child, not yet reaped (done is false).
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
                break;
            }
        }
    })
}

fn which(tool: &str) -> anyhow::Result<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
        .with_context(|| format!("{tool} not found on PATH"))
}

fn chmod_x(p: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for i in 0..1000u32 {
        let p = base.join(format!("limiter-guest-{}-{i}", std::process::id()));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    bail!("no temporary directory under {}", base.display())
}
