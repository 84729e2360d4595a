//! Map commands as bytes: on pinned maps of layouts this build does not
//! know, which aya's typed maps cannot open (an upgrade reads and copies
//! them), and whole-map reads in batches, which aya has not.

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

/// Write `value` (of the map's size; per CPU values as for [`elem`])
/// under `key`.
pub fn update(map: &MapData, key: &[u8], value: &[u8]) -> io::Result<()> {
    // The kernel only reads the value of an update.
    elem_raw(map, Cmd::Update, key.as_ptr(), value.as_ptr().cast_mut())
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

/// Entries asked for per `BPF_MAP_LOOKUP_BATCH` call by [`count_entries`].
const BATCH: u32 = 4096;

/// The number of entries of a hash map, read in batches of [`BATCH`]
/// (`BPF_MAP_LOOKUP_BATCH`, kernel 5.6+): a few hundred system calls for
/// a million entries, where walking the keys takes one per entry. Each
/// batch is one consistent snapshot of some of the map's hash buckets;
/// entries added or removed during the count may or may not be counted,
/// as in a walk.
pub fn count_entries(map: &MapData) -> io::Result<usize> {
    for_each_entry(map, |_, _| ())
}

/// Every entry of `map` (a hash map or an array, per CPU or not) as its
/// key's and value's bytes, read in batches of [`BATCH`]; a per-CPU
/// value is each possible CPU's in turn, each rounded up to 8 bytes
/// (other values are as large as the map's value size).
/// Returns how many entries there were.
pub fn for_each_entry(map: &MapData, mut each: impl FnMut(&[u8], &[u8])) -> io::Result<usize> {
    use std::os::fd::{AsFd as _, AsRawFd as _};

    use aya::maps::MapType;
    let info = map.info().map_err(io::Error::other)?;
    let per_cpu = matches!(info.map_type(), Ok(MapType::PerCpuHash | MapType::LruPerCpuHash | MapType::PerCpuArray));
    let cpus = if per_cpu { aya::util::nr_cpus().map_err(|(_, e)| e)? } else { 1 };
    // Per-CPU values come one per CPU, each rounded up to 8 bytes; other
    // values back to back at their own size.
    let size = usize::try_from(info.value_size()).unwrap_or(usize::MAX);
    let value = if per_cpu { size.next_multiple_of(8) * cpus } else { size };
    let key = usize::try_from(info.key_size()).unwrap_or(usize::MAX);
    let fd = u32::try_from(map.fd().as_fd().as_raw_fd()).unwrap_or(u32::MAX);
    // No batch need be larger than the map: an array of a few hundred
    // counters asks for them, not for `BATCH`.
    let mut ask = BATCH.min(info.max_entries().max(1));
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    // The batch token: a hash table's next bucket index (a u32), an
    // array's last key (a u32).
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut total = 0;
    let mut first = true;
    loop {
        let n = ask as usize;
        // Zeroed allocations (calloc), not a byte-by-byte fill.
        if keys.len() != key * n {
            keys = vec![0u8; key * n];
            values = vec![0u8; value * n];
        }
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { (&raw const token_in) as u64 },
            out_batch: (&raw mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: ask,
            map_fd: fd,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the kernel writes at most `count` keys and values of the
        // map's sizes into buffers of that many, and a u32 token into
        // `out_batch`; it reads the token back from `in_batch`.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &raw mut attr, size_of::<BatchAttr>()) };
        let err = (rc != 0).then(io::Error::last_os_error);
        let got = (attr.count as usize).min(n);
        match err.as_ref().and_then(io::Error::raw_os_error) {
            // One hash bucket holds more entries than were asked for.
            Some(libc::ENOSPC) if ask < 1 << 20 => {
                ask *= 2;
                continue;
            }
            // `ENOENT`: the end of the map; `count` is the last batch's.
            None | Some(libc::ENOENT) => {
                for (k, v) in keys.chunks_exact(key.max(1)).zip(values.chunks_exact(value.max(1))).take(got) {
                    each(k, v);
                }
                total += got;
            }
            Some(_) => return Err(err.unwrap_or_else(io::Error::last_os_error)),
        }
        if err.is_some() {
            return Ok(total);
        }
        token_in = token_out;
        first = false;
    }
}

const BPF_MAP_LOOKUP_BATCH: i32 = 24;
const BPF_MAP_UPDATE_BATCH: i32 = 26;
const BPF_MAP_DELETE_BATCH: i32 = 27;

/// Entries written or removed per batch call: each call holds no lock
/// across entries and yields between them, so a million entries never
/// stall a CPU; the calls are a few hundred.
const WRITE_BATCH: usize = 4096;

/// Write every `(key, value)` of `keys`/`values` (the bytes of `n`
/// keys and `n` values of the map's sizes, one after another) into
/// `map` in batches (`BPF_MAP_UPDATE_BATCH`, kernel 5.6+).
pub fn update_batch(map: &MapData, keys: &[u8], values: &[u8], key: usize, value: usize) -> io::Result<()> {
    for (k, v) in keys.chunks(key * WRITE_BATCH).zip(values.chunks(value * WRITE_BATCH)) {
        batch(map, BPF_MAP_UPDATE_BATCH, k, Some(v), k.len() / key)?;
    }
    Ok(())
}

/// Remove every key of `keys` (the bytes of keys of `key` bytes) from
/// `map` in batches (`BPF_MAP_DELETE_BATCH`); keys not there are skipped.
pub fn delete_batch(map: &MapData, keys: &[u8], key: usize) -> io::Result<()> {
    for k in keys.chunks(key * WRITE_BATCH) {
        // A key not there stops a batch with ENOENT after the ones before
        // it: the rest go one by one.
        if let Err(e) = batch(map, BPF_MAP_DELETE_BATCH, k, None, k.len() / key) {
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
            for one in k.chunks(key) {
                match batch(map, BPF_MAP_DELETE_BATCH, one, None, 1) {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

fn batch(map: &MapData, cmd: i32, keys: &[u8], values: Option<&[u8]>, n: usize) -> io::Result<()> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let fd = u32::try_from(map.fd().as_fd().as_raw_fd()).unwrap_or(u32::MAX);
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.map_or(0, |v| v.as_ptr() as u64),
        count: u32::try_from(n).unwrap_or(u32::MAX),
        map_fd: fd,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: the kernel reads `count` keys (and values) of the map's
    // sizes from buffers that hold that many, and writes `count` back.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, &raw mut attr, size_of::<BatchAttr>()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `union bpf_attr` as the batch commands read it.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The kernel memory of `map` (its fdinfo's `memlock`), if known.
#[must_use]
pub fn memlock(map: &MapData) -> Option<u64> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let fd = map.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}
