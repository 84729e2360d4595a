//! The source line of each JIT instruction of a loaded program's main
//! function, from the kernel's line info (`BPF_OBJ_GET_INFO_BY_FD`) and the
//! program's BTF strings: what turns a perf sample at
//! `bpf_prog_<tag>_limiter+0x2e5` into a line of the program's source.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use aya::programs::loaded_programs;

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
/// Offsets in `struct bpf_prog_info` (include/uapi/linux/bpf.h).
const NR_JITED_KSYMS: usize = 104;
const JITED_KSYMS: usize = 112;
const BTF_ID: usize = 128;
const NR_LINE_INFO: usize = 148;
const LINE_INFO: usize = 152;
const JITED_LINE_INFO: usize = 160;
const NR_JITED_LINE_INFO: usize = 168;
const LINE_INFO_REC_SIZE: usize = 172;
const JITED_LINE_INFO_REC_SIZE: usize = 176;
const JITED_FUNC_LENS: usize = 120;
const NR_JITED_FUNC_LENS: usize = 108;
const INFO_LEN: usize = 256;

/// The main function's JIT offsets, each with its source line, sorted.
pub struct JitLines(Vec<(u64, String)>);

impl JitLines {
    /// The newest loaded program named `name`.
    pub fn of(name: &str) -> Option<Self> {
        let info = loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| p.name_as_str() == Some(name))
            .max_by_key(aya::programs::ProgramInfo::id)?;
        let fd = info.fd().ok()?;
        let fd = fd.as_fd().as_raw_fd();
        let mut buf = [0u8; INFO_LEN];
        obj_info(fd, &mut buf).ok()?;
        let rd32 = |b: &[u8], o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let (n_ksyms, n_lens, n_lines, n_jited_lines) = (
            rd32(&buf, NR_JITED_KSYMS),
            rd32(&buf, NR_JITED_FUNC_LENS),
            rd32(&buf, NR_LINE_INFO),
            rd32(&buf, NR_JITED_LINE_INFO),
        );
        let (lrs, jlrs, btf_id) =
            (rd32(&buf, LINE_INFO_REC_SIZE), rd32(&buf, JITED_LINE_INFO_REC_SIZE), rd32(&buf, BTF_ID));
        if n_ksyms == 0 || n_lines == 0 || n_lines != n_jited_lines || lrs < 16 || jlrs != 8 {
            return None;
        }
        let mut ksyms = vec![0u64; n_ksyms as usize];
        let mut lens = vec![0u32; n_lens as usize];
        let mut li = vec![0u8; (n_lines * lrs) as usize];
        let mut jli = vec![0u64; n_jited_lines as usize];
        let mut buf = [0u8; INFO_LEN];
        let put32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_ne_bytes());
        let put64 = |b: &mut [u8], o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_ne_bytes());
        put32(&mut buf, NR_JITED_KSYMS, n_ksyms);
        put64(&mut buf, JITED_KSYMS, ksyms.as_mut_ptr() as u64);
        put32(&mut buf, NR_JITED_FUNC_LENS, n_lens);
        put64(&mut buf, JITED_FUNC_LENS, lens.as_mut_ptr() as u64);
        put32(&mut buf, NR_LINE_INFO, n_lines);
        put64(&mut buf, LINE_INFO, li.as_mut_ptr() as u64);
        put32(&mut buf, NR_JITED_LINE_INFO, n_jited_lines);
        put64(&mut buf, JITED_LINE_INFO, jli.as_mut_ptr() as u64);
        put32(&mut buf, LINE_INFO_REC_SIZE, lrs);
        put32(&mut buf, JITED_LINE_INFO_REC_SIZE, jlrs);
        obj_info(fd, &mut buf).ok()?;
        let strings = btf_strings(btf_id)?;
        let text = |off: u32| {
            let s = strings.get(off as usize..).unwrap_or_default();
            String::from_utf8_lossy(&s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]).into_owned()
        };
        let (base, len) = (ksyms[0], u64::from(*lens.first()?));
        let mut lines: Vec<(u64, String)> = (0..n_lines as usize)
            .filter_map(|i| {
                let r = &li[i * lrs as usize..];
                let off = jli[i].checked_sub(base).filter(|o| *o < len)?;
                let file = text(rd32(r, 4));
                let file = file.rsplit('/').next().unwrap_or_default().to_string();
                let line = rd32(r, 12) >> 10;
                Some((off, format!("{file}:{line} {}", text(rd32(r, 8)).trim())))
            })
            .collect();
        lines.sort_by_key(|(o, _)| *o);
        Some(Self(lines))
    }

    /// The source line of the instruction at `off`.
    pub fn at(&self, off: u64) -> Option<&str> {
        let i = self.0.partition_point(|(o, _)| *o <= off).checked_sub(1)?;
        Some(&self.0[i].1)
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `buf`.
fn obj_info(fd: i32, buf: &mut [u8]) -> std::io::Result<()> {
    // union bpf_attr.info: bpf_fd, info_len, info.
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&fd.to_ne_bytes());
    attr[4..8].copy_from_slice(&u32::try_from(buf.len()).unwrap().to_ne_bytes());
    attr[8..16].copy_from_slice(&(buf.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: attr points at a valid bpf_attr prefix naming buf, which
    // outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// The string section of BTF object `id`.
fn btf_strings(id: u32) -> Option<Vec<u8>> {
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&id.to_ne_bytes());
    // SAFETY: attr is a valid bpf_attr prefix (btf_id).
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_BTF_GET_FD_BY_ID, attr.as_mut_ptr(), attr.len()) };
    let fd = i32::try_from(fd).ok().filter(|f| *f >= 0)?;
    // SAFETY: a descriptor the kernel just gave us.
    let fd: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    // struct bpf_btf_info: btf (u64), btf_size (u32), id (u32), ...
    let mut info = [0u8; 32];
    obj_info(fd.as_raw_fd(), &mut info).ok()?;
    let size = u32::from_ne_bytes(info[8..12].try_into().unwrap());
    let mut btf = vec![0u8; size as usize];
    let mut info = [0u8; 32];
    info[..8].copy_from_slice(&(btf.as_mut_ptr() as u64).to_ne_bytes());
    info[8..12].copy_from_slice(&size.to_ne_bytes());
    obj_info(fd.as_raw_fd(), &mut info).ok()?;
    // struct btf_header: magic, version, flags, hdr_len, type_off,
    // type_len, str_off, str_len.
    let rd = |o: usize| -> Option<usize> { Some(u32::from_ne_bytes(btf.get(o..o + 4)?.try_into().ok()?) as usize) };
    let (hdr, str_off, str_len) = (rd(4)?, rd(16)?, rd(20)?);
    btf.get(hdr + str_off..hdr + str_off + str_len).map(<[u8]>::to_vec)
}
