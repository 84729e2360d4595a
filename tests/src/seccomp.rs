//! systemd's `RestrictAddressFamilies=` without systemd: a seccomp filter
//! that makes socket(2) fail with EAFNOSUPPORT for every address family
//! not listed, as systemd's own filter does, installed in a child before
//! it execs. Lets a test run the daemon under the unit's restrictions on a
//! machine whose PID 1 is not systemd.

use std::{os::unix::process::CommandExt as _, process::Command};

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// Offsets in `struct seccomp_data`: syscall number, first argument (low
/// half, little-endian).
const NR: u32 = 0;
const ARG0: u32 = 16;

/// The families a unit's `RestrictAddressFamilies=` line names.
#[must_use]
pub fn families(line: &str) -> Vec<i32> {
    line.split_whitespace()
        .map(|f| match f {
            "AF_UNIX" => libc::AF_UNIX,
            "AF_INET" => libc::AF_INET,
            "AF_INET6" => libc::AF_INET6,
            "AF_NETLINK" => libc::AF_NETLINK,
            "AF_PACKET" => libc::AF_PACKET,
            other => panic!("family {other} not known to this test"),
        })
        .collect()
}

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Make `cmd`'s process refuse sockets of any family but `allowed`.
pub fn restrict_address_families(cmd: &mut Command, allowed: &[i32]) {
    let n = u8::try_from(allowed.len()).expect("a few families");
    let mut prog = vec![
        op(BPF_LD_W_ABS, 0, 0, NR),
        // Not socket(2): allow.
        op(BPF_JEQ_K, 0, n + 2, u32::try_from(libc::SYS_socket).unwrap()),
        op(BPF_LD_W_ABS, 0, 0, ARG0),
    ];
    for (i, f) in allowed.iter().enumerate() {
        // Listed: jump to the allow at the end.
        let to_allow = n - u8::try_from(i).unwrap();
        prog.push(op(BPF_JEQ_K, to_allow, 0, u32::try_from(*f).unwrap()));
    }
    prog.push(op(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | u32::try_from(libc::EAFNOSUPPORT).unwrap()));
    prog.push(op(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW));
    // SAFETY: only async-signal-safe syscalls between fork and exec; the
    // program outlives them (it is moved into the closure).
    unsafe {
        cmd.pre_exec(move || {
            let fprog =
                libc::sock_fprog { len: u16::try_from(prog.len()).unwrap_or(0), filter: prog.as_ptr().cast_mut() };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &raw const fprog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
