//! `cargo xtask package`: the Debian package, built with `dpkg-deb` from
//! the release binary and the files under `packaging/`.
//!
//! dpkg-deb rather than cargo-deb: it is in every Debian (cargo-deb would
//! be one more `cargo install` on every fresh machine), and the package
//! needs hand-written maintainer scripts and generated files (man pages,
//! completions, all made by the binary itself) that a staging directory
//! holds as plainly as any tool's configuration would.
//!
//! The layout (`target/debian/limiter_VERSION_ARCH.deb`):
//!
//! | path | from |
//! |---|---|
//! | `/usr/sbin/limiter` | the release binary, stripped |
//! | `/lib/systemd/system/limiter@.service` | `packaging/limiter@.service` |
//! | `/etc/limiter/limiter.toml` (conffile) | `packaging/limiter.toml` |
//! | `/usr/share/man/man8/limiter*.8.gz` | `limiter man --dir` |
//! | bash, zsh, fish completions | `limiter completions SHELL` |
//! | `/usr/share/limiter/{grafana,prometheus}/` | `packaging/grafana`, `packaging/prometheus` |
//! | `/usr/share/doc/limiter/` | copyright, changelog, README, the pages of `docs/`, examples |
//! | maintainer scripts | `packaging/debian/{postinst,prerm,postrm}` |

use std::{
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// Where each generated or copied file goes, relative to the package root.
const MAN_DIR: &str = "usr/share/man/man8";
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "usr/share/bash-completion/completions/limiter"),
    ("zsh", "usr/share/zsh/vendor-completions/_limiter"),
    ("fish", "usr/share/fish/vendor_completions.d/limiter.fish"),
];
const COPIED: [(&str, &str, u32); 7] = [
    ("packaging/limiter@.service", "lib/systemd/system/limiter@.service", 0o644),
    ("packaging/limiter.toml", "etc/limiter/limiter.toml", 0o644),
    ("packaging/grafana/limiter.json", "usr/share/limiter/grafana/limiter.json", 0o644),
    ("packaging/prometheus/limiter-alerts.yml", "usr/share/limiter/prometheus/limiter-alerts.yml", 0o644),
    ("packaging/forward.conf", "usr/share/doc/limiter/examples/forward.conf", 0o644),
    ("packaging/debian/copyright", "usr/share/doc/limiter/copyright", 0o644),
    ("packaging/limiter.toml", "usr/share/doc/limiter/examples/limiter.toml", 0o644),
];
const SCRIPTS: [&str; 3] = ["postinst", "prerm", "postrm"];
const CONFFILES: &str = "/etc/limiter/limiter.toml\n";

/// Build the package from the release binary at `bin`; `revision` is the
/// Debian revision (`0.1.0-REVISION`). Returns the `.deb`'s path.
pub fn package(bin: &Path, revision: u32) -> anyhow::Result<PathBuf> {
    let (version, git_rev) = binary_version(bin)?;
    let deb_version = format!("{version}-{revision}");
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let out_dir = PathBuf::from("target/debian");
    let root = out_dir.join(format!("limiter_{deb_version}_{arch}"));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }

    let sbin = root.join("usr/sbin/limiter");
    mkdir_for(&sbin)?;
    let mut strip = Command::new("strip");
    strip.args(["--strip-unneeded", "--remove-section=.comment", "--remove-section=.note", "-o"]).arg(&sbin).arg(bin);
    super::run(strip)?;
    fs::set_permissions(&sbin, fs::Permissions::from_mode(0o755))?;

    for (from, to, mode) in COPIED {
        install(&fs::read(from).with_context(|| format!("reading {from}"))?, &root.join(to), mode)?;
    }
    let readme = fs::read("README.md").context("reading README.md")?;
    install(&gzip(&readme)?, &root.join("usr/share/doc/limiter/README.md.gz"), 0o644)?;
    // The operator's pages beside it (the README links to them).
    for page in doc_pages()? {
        let text = fs::read(&page).with_context(|| format!("reading {}", page.display()))?;
        let name = page.file_name().context("a page's name")?.to_string_lossy();
        install(&gzip(&text)?, &root.join(format!("usr/share/doc/limiter/{name}.gz")), 0o644)?;
    }
    let changelog = fs::read_to_string("packaging/debian/changelog")?
        .replace("@VERSION@", &deb_version)
        .replace("@REVISION@", &git_rev)
        .replace("@DATE@", &output(Command::new("date").arg("-R"))?);
    install(&gzip(changelog.as_bytes())?, &root.join("usr/share/doc/limiter/changelog.Debian.gz"), 0o644)?;

    man_pages(bin, &root.join(MAN_DIR))?;
    let policy = Command::new(bin).args(["man", "--policy"]).output().context("limiter man --policy")?;
    if !policy.status.success() || policy.stdout.is_empty() {
        bail!("limiter man --policy failed");
    }
    install(&gzip(&policy.stdout)?, &root.join("usr/share/man/man5/limiter.toml.5.gz"), 0o644)?;
    for (shell, to) in COMPLETIONS {
        let script = Command::new(bin).args(["completions", shell]).output().context("limiter completions")?;
        if !script.status.success() || script.stdout.is_empty() {
            bail!("limiter completions {shell} failed");
        }
        install(&script.stdout, &root.join(to), 0o644)?;
    }

    // Directories as Debian wants them, whatever the umask.
    let mut chmod = Command::new("find");
    chmod.arg(&root).args(["-type", "d", "-exec", "chmod", "0755", "{}", "+"]);
    super::run(chmod)?;
    control(&root, &deb_version, &arch)?;
    let deb = out_dir.join(format!("limiter_{deb_version}_{arch}.deb"));
    let mut build = Command::new("dpkg-deb");
    build.args(["--root-owner-group", "-Zxz", "--build"]).arg(&root).arg(&deb);
    super::run(build)?;
    Ok(deb)
}

/// `limiter 0.1.0 (git 0123456789ab)` -> ("0.1.0", "0123456789ab").
fn binary_version(bin: &Path) -> anyhow::Result<(String, String)> {
    let line = output(Command::new(bin).arg("--version"))?;
    let parse = || {
        let rest = line.strip_prefix("limiter ")?;
        let (version, git) = rest.split_once(" (git ")?;
        Some((version.to_owned(), git.strip_suffix(')')?.to_owned()))
    };
    parse().with_context(|| format!("unexpected `limiter --version`: {line}"))
}

/// One gzipped page per verb (`gzip -9n`, as Debian wants them).
fn man_pages(bin: &Path, dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir)?;
    let mut man = Command::new(bin);
    man.args(["man", "--dir"]).arg(dir);
    super::run(man)?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let page = fs::read(&path)?;
        fs::remove_file(&path)?;
        let mut gz = path.into_os_string();
        gz.push(".gz");
        install(&gzip(&page)?, Path::new(&gz), 0o644)?;
    }
    Ok(())
}

/// DEBIAN/: control (its Depends from `dpkg-shlibdeps`), conffiles, the
/// maintainer scripts and md5sums.
fn control(root: &Path, deb_version: &str, arch: &str) -> anyhow::Result<()> {
    let md5sums = output(
        Command::new("sh")
            .current_dir(root)
            .args(["-c", "find . -type f ! -path './DEBIAN/*' -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 md5sum"]),
    )?;
    let size_kib = output(Command::new("du").args(["-sk", "--apparent-size"]).arg(root))?;
    let size_kib = size_kib.split_whitespace().next().context("du")?.to_owned();
    let text = fs::read_to_string("packaging/debian/control")?
        .replace("@VERSION@", deb_version)
        .replace("@ARCH@", arch)
        .replace("@INSTALLED_SIZE@", &size_kib)
        .replace("@DEPENDS@", &format!("{}, passwd", shlib_depends(root)?));
    let debian = root.join("DEBIAN");
    install(text.as_bytes(), &debian.join("control"), 0o644)?;
    install(CONFFILES.as_bytes(), &debian.join("conffiles"), 0o644)?;
    install(format!("{md5sums}\n").as_bytes(), &debian.join("md5sums"), 0o644)?;
    for s in SCRIPTS {
        install(&fs::read(format!("packaging/debian/{s}"))?, &debian.join(s), 0o755)?;
    }
    Ok(())
}

/// The shared libraries the binary needs, as dpkg-shlibdeps names their
/// packages (`libc6 (>= 2.34), libgcc-s1 (>= 4.2)`).
fn shlib_depends(root: &Path) -> anyhow::Result<String> {
    // dpkg-shlibdeps wants a source package's debian/control around it.
    let work = root.parent().context("package root")?.join("shlibdeps");
    fs::create_dir_all(work.join("debian"))?;
    fs::write(work.join("debian/control"), "Source: limiter\n\nPackage: limiter\nArchitecture: any\n")?;
    let bin = fs::canonicalize(root.join("usr/sbin/limiter"))?;
    let line = output(Command::new("dpkg-shlibdeps").current_dir(&work).args(["-O", "-e"]).arg(bin))?;
    let deps = line.strip_prefix("shlibs:Depends=").with_context(|| format!("dpkg-shlibdeps said: {line}"))?;
    Ok(deps.to_owned())
}

fn gzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut child = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running gzip")?;
    let mut stdin = child.stdin.take().context("gzip stdin")?;
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output()?;
    writer.join().map_err(|_| anyhow::anyhow!("gzip writer panicked"))??;
    if !out.status.success() {
        bail!("gzip failed: {}", out.status);
    }
    Ok(out.stdout)
}

fn mkdir_for(path: &Path) -> anyhow::Result<()> {
    let dir = path.parent().context("no parent")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn install(data: &[u8], to: &Path, mode: u32) -> anyhow::Result<()> {
    mkdir_for(to)?;
    fs::write(to, data).with_context(|| format!("writing {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// A command's stdout, trimmed; its failure is an error.
fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The pages of `docs/` the package installs beside the README: every
/// `*.md` there, in name order.
pub fn doc_pages() -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut v: Vec<std::path::PathBuf> = fs::read_dir("docs")
        .context("reading docs/")?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    v.sort();
    Ok(v)
}
