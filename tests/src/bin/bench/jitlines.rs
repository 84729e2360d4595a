//! The source line of each JIT instruction of a loaded program (its
//! entry point and its global functions), from the kernel's line info (`BPF_OBJ_GET_INFO_BY_FD`) and the
//! program's BTF strings: what turns a perf sample at
//! `bpf_prog_<tag>_limiter+0x2e5` into a line of the program's source.
//! The kernel's structures are aya-obj's bindings of the UAPI header.

use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};

use aya::programs::{ProgramInfo, loaded_programs};
use aya_obj::generated::{bpf_attr, bpf_btf_info, bpf_cmd, bpf_line_info, bpf_prog_info, btf_header};

/// A line of the program's source.
pub struct Line {
    /// The source file's path as the compiler recorded it.
    pub path: String,
    pub number: u32,
    pub text: String,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = self.path.rsplit('/').next().unwrap_or_default();
        write!(f, "{file}:{} {}", self.number, self.text.trim())
    }
}

/// A loaded program's functions: the JIT address of each line's first
/// instruction, sorted, and where each function's code lies.
pub struct JitLines {
    lines: Vec<(u64, Line)>,
    functions: Vec<(u64, u64)>,
}

impl JitLines {
    /// The newest loaded program named `name`.
    pub fn of(name: &str) -> Option<Self> {
        let info = loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| p.name_as_str() == Some(name))
            .max_by_key(ProgramInfo::id)?;
        let fd = info.fd().ok()?;
        let fd = fd.as_fd().as_raw_fd();
        // SAFETY: a plain C struct, all zeroes valid.
        let mut counts: bpf_prog_info = unsafe { std::mem::zeroed() };
        obj_info(fd, &mut counts).ok()?;
        let (n, rec) = (counts.nr_line_info as usize, counts.line_info_rec_size as usize);
        if counts.nr_jited_ksyms == 0
            || n == 0
            || counts.nr_jited_line_info as usize != n
            || rec < size_of::<bpf_line_info>()
        {
            return None;
        }
        let mut ksyms = vec![0u64; counts.nr_jited_ksyms as usize];
        let mut lens = vec![0u32; counts.nr_jited_func_lens as usize];
        let mut li = vec![0u8; n * rec];
        let mut jli = vec![0u64; n];
        // SAFETY: as above.
        let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
        (info.nr_jited_ksyms, info.jited_ksyms) = (counts.nr_jited_ksyms, ksyms.as_mut_ptr() as u64);
        (info.nr_jited_func_lens, info.jited_func_lens) = (counts.nr_jited_func_lens, lens.as_mut_ptr() as u64);
        (info.nr_line_info, info.line_info, info.line_info_rec_size) =
            (counts.nr_line_info, li.as_mut_ptr() as u64, counts.line_info_rec_size);
        (info.nr_jited_line_info, info.jited_line_info) = (counts.nr_jited_line_info, jli.as_mut_ptr() as u64);
        info.jited_line_info_rec_size = counts.jited_line_info_rec_size;
        obj_info(fd, &mut info).ok()?;
        let strings = btf_strings(counts.btf_id)?;
        let text = |off: u32| {
            let s = strings.get(off as usize..).unwrap_or_default();
            String::from_utf8_lossy(&s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]).into_owned()
        };
        let functions: Vec<(u64, u64)> = ksyms.iter().zip(&lens).map(|(&k, &l)| (k, k + u64::from(l))).collect();
        let mut lines: Vec<(u64, Line)> = li
            .chunks_exact(rec)
            .zip(&jli)
            .map(|(r, &addr)| {
                // SAFETY: `rec` bytes the kernel wrote, at least a bpf_line_info.
                let r: bpf_line_info = unsafe { r.as_ptr().cast::<bpf_line_info>().read_unaligned() };
                (addr, Line { path: text(r.file_name_off), number: r.line_col >> 10, text: text(r.line_off) })
            })
            .collect();
        lines.sort_by_key(|(a, _)| *a);
        Some(Self { lines, functions })
    }

    /// The source line of the JIT instruction at address `ip`, in any
    /// function of the program (its entry point and the global
    /// functions it calls).
    pub fn at(&self, ip: u64) -> Option<&Line> {
        if !self.functions.iter().any(|&(start, end)| (start..end).contains(&ip)) {
            return None;
        }
        let i = self.lines.partition_point(|(a, _)| *a <= ip).checked_sub(1)?;
        Some(&self.lines[i].1)
    }
}

/// `bpf(cmd, attr)`.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<i64> {
    // SAFETY: attr is a whole bpf_attr, and whatever it points at outlives
    // the call.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, std::ptr::from_mut(attr), size_of::<bpf_attr>()) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(rc) }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (a `bpf_*_info`).
fn obj_info<T>(fd: i32, info: &mut T) -> std::io::Result<()> {
    // SAFETY: a C union, all zeroes valid.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = u32::try_from(fd).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    attr.info.info_len = u32::try_from(size_of::<T>()).unwrap_or(u32::MAX);
    attr.info.info = std::ptr::from_mut(info) as u64;
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

/// The string section of BTF object `id`.
fn btf_strings(id: u32) -> Option<Vec<u8>> {
    // SAFETY: a C union, all zeroes valid.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.__bindgen_anon_6.__bindgen_anon_1.btf_id = id;
    let fd = i32::try_from(bpf(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr).ok()?).ok()?;
    // SAFETY: a descriptor the kernel just gave us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a plain C struct, all zeroes valid.
    let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
    obj_info(fd.as_raw_fd(), &mut info).ok()?;
    let mut btf = vec![0u8; info.btf_size as usize];
    let size = info.btf_size;
    // SAFETY: as above.
    let mut info: bpf_btf_info = unsafe { std::mem::zeroed() };
    (info.btf, info.btf_size) = (btf.as_mut_ptr() as u64, size);
    obj_info(fd.as_raw_fd(), &mut info).ok()?;
    if btf.len() < size_of::<btf_header>() {
        return None;
    }
    // SAFETY: the buffer holds at least a header.
    let h: btf_header = unsafe { btf.as_ptr().cast::<btf_header>().read_unaligned() };
    let start = h.hdr_len as usize + h.str_off as usize;
    btf.get(start..start + h.str_len as usize).map(<[u8]>::to_vec)
}
