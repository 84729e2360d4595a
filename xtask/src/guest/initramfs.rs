//! The guest's initramfs: static busybox, `guest/init.sh` as `/init`, and
//! the kernel's modules that reach the root (decompressed, in dependency
//! order).

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use super::{Kernel, chmod_x, sh_quote, which};

/// Modules the initramfs loads to reach the root, in dependency order.
const BOOT_MODULES: &[&str] = &["virtio_mmio", "virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// Build the initramfs for `k` at `out`.
pub(super) fn initramfs(k: &Kernel, work: &Path, out: &Path) -> anyhow::Result<()> {
    let root = work.join("initrd");
    for d in ["bin", "mods", "proc", "sys", "dev", "lower", "rw", "newroot"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    let busybox = which("busybox")?;
    std::fs::copy(&busybox, root.join("bin/busybox"))?;
    for a in
        ["sh", "mount", "mkdir", "insmod", "cat", "cp", "rm", "ln", "switch_root", "reboot", "sleep", "ip", "hostname"]
    {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(a))?;
    }
    std::fs::write(root.join("init"), include_str!("../../guest/init.sh"))?;
    chmod_x(&root.join("init"))?;
    let moddir = k.dir.join("lib/modules").join(&k.version);
    let dep = std::fs::read_to_string(moddir.join("modules.dep")).context("modules.dep")?;
    let mut order = Vec::new();
    for m in BOOT_MODULES {
        add_module(&dep, &moddir, m, &root.join("mods"), &mut order)?;
    }
    std::fs::write(root.join("mods/order"), order.join("\n") + "\n")?;
    let mut find = Command::new("sh");
    find.arg("-c").arg(format!("cd {} && find . | cpio -o -H newc --quiet > {}", sh_quote(&root), sh_quote(out)));
    crate::run(find)
}

/// Copy module `name` (after its dependencies, decompressed) into `mods`.
fn add_module(dep: &str, moddir: &Path, name: &str, mods: &Path, order: &mut Vec<String>) -> anyhow::Result<()> {
    if order.iter().any(|m| m == name) {
        return Ok(());
    }
    let Some(line) = dep.lines().find(|l| {
        let file = l.split(':').next().unwrap_or("");
        let base = file.rsplit('/').next().unwrap_or("");
        base.split(".ko").next() == Some(name)
    }) else {
        return Ok(()); // built in
    };
    let (path, deps) = line.split_once(':').unwrap_or((line, ""));
    for d in deps.split_whitespace().rev() {
        let base = d.rsplit('/').next().unwrap_or(d);
        add_module(dep, moddir, base.split(".ko").next().unwrap_or(base), mods, order)?;
    }
    let src = moddir.join(path);
    let dst = mods.join(format!("{name}.ko"));
    let tool = match Path::new(path).extension().and_then(|e| e.to_str()) {
        Some("xz") => Some("xz"),
        Some("zst") => Some("zstd"),
        _ => None,
    };
    match tool {
        Some(t) => {
            let out = Command::new(t).arg("-dc").arg(&src).output().with_context(|| format!("{t} -dc"))?;
            if !out.status.success() {
                bail!("{t} -dc {} failed", src.display());
            }
            std::fs::write(&dst, out.stdout)?;
        }
        None => {
            std::fs::copy(&src, &dst)?;
        }
    }
    order.push(name.to_owned());
    Ok(())
}
