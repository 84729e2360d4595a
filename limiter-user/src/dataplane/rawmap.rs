//! Map commands on pinned maps of layouts this build does not know, which
//! aya's typed maps cannot open: an upgrade reads and copies them as bytes.

use std::io;

use aya::maps::MapData;

/// The BPF map commands used on maps whose layouts this build does not
/// know (so aya's typed maps cannot open them).
#[derive(Clone, Copy)]
pub enum Cmd {
    Lookup = 1,
    Update = 2,
    NextKey = 4,
}

/// `cmd` on `map` with `key` (of the map's key size) and `out` (a value,
/// or for [`Cmd::NextKey`] a key, buffer of the map's size: per CPU
/// values take one 8-byte-rounded value per possible CPU).
pub fn elem(map: &MapData, cmd: Cmd, key: &[u8], out: *mut u8) -> io::Result<()> {
    elem_raw(map, cmd, key.as_ptr(), out)
}

pub fn elem_raw(map: &MapData, cmd: Cmd, key: *const u8, out: *mut u8) -> io::Result<()> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let fd = map.fd().as_fd().as_raw_fd();
    let attr =
        Elem { map_fd: u32::try_from(fd).unwrap_or(u32::MAX), pad: 0, key: key as u64, value: out as u64, flags: 0 };
    // SAFETY: the kernel reads a key of the map's key size at `key` (or
    // none, for the first NextKey) and reads or writes one value (or key)
    // of the map's size at `out`; callers size both from the map's info.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd as i32, &raw const attr, size_of::<Elem>()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `union bpf_attr` as the map element commands read it: map_fd, 4 bytes
/// of padding, key pointer, value (or next key) pointer, flags.
#[repr(C)]
struct Elem {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}
