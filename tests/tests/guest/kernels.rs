//! The oldest supported kernel, probed: on an older one the daemon
//! refuses at start with one line that names each helper the kernel lacks
//! and the oldest supported release, before it loads or pins anything.
//! Ignored on the host: the guest tier of `cargo xtask test` runs it in
//! a guest of Debian 11's stock kernel (5.10), below the minimum.

use std::process::Command;

use limiter_tests::{kernel, scenario};

#[test]
#[ignore = "needs a kernel older than 6.1: the guest tier runs it on Debian 11's 5.10"]
fn an_older_kernel_is_refused_in_one_line_naming_what_it_lacks() {
    let _alone = limiter_tests::alone(module_path!());
    kernel::require_root();
    let release = kernel::release();
    let v = kernel::release_version(&release).expect("a numbered release");
    assert!(v < limiter::dataplane::kernel::MINIMUM, "{release} is not older than the minimum");
    let pins = std::env::temp_dir().join(format!("limiter-old-kernel-{}", std::process::id()));
    let out = Command::new(scenario::locate_bin("limiter").unwrap())
        .args(["run", "--iface", "lo", "--pin", "--pin-dir"])
        .arg(&pins)
        .arg("--socket")
        .arg(scenario::unique_socket("oldk"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success(), "the daemon ran on {release}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, not {}: {stderr}", lines.len());
    let line = lines[0];
    assert!(
        line.starts_with(&format!("limiter: kernel {release} lacks bpf_ktime_get_coarse_ns (kernel 5.11+")),
        "{line}"
    );
    assert!(line.contains("bpf_tcp_raw_gen_syncookie_ipv4 (kernel 6.0+, for SYN cookies)"), "{line}");
    assert!(line.ends_with("the oldest kernel this build supports is 6.1 (docs/operations.md#kernels)"), "{line}");
    // Refused before anything was pinned.
    assert!(!pins.exists(), "{} was made", pins.display());
}
