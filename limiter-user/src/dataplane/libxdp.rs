//! libxdp (Debian's `libxdp1`), the keeper of the multi-program dispatcher
//! convention: what is on an interface (a dispatcher and its components,
//! or one program alone), and adding or removing a component, under
//! libxdp's lock on `/sys/fs/bpf/xdp`, with the atomic dispatcher swap it
//! does for every change. Linked rather than re-implemented: the lock,
//! the pin layout and the dispatcher object are then exactly those that
//! `xdp-loader` and `xdp-filter` use. Only this module calls it.

use std::{
    ffi::{CStr, c_char, c_int, c_uint, c_void},
    os::fd::{AsRawFd as _, BorrowedFd},
};

#[repr(C)]
struct XdpProgram {
    _opaque: [u8; 0],
}

#[repr(C)]
struct XdpMultiprog {
    _opaque: [u8; 0],
}

#[link(name = "xdp")]
unsafe extern "C" {
    fn libxdp_get_error(ptr: *const c_void) -> std::ffi::c_long;
    fn libxdp_strerror(err: c_int, buf: *mut c_char, size: usize) -> c_int;
    fn xdp_program__from_fd(fd: c_int) -> *mut XdpProgram;
    fn xdp_program__from_id(id: u32) -> *mut XdpProgram;
    fn xdp_program__from_pin(path: *const c_char) -> *mut XdpProgram;
    fn xdp_program__close(p: *mut XdpProgram);
    fn xdp_program__name(p: *const XdpProgram) -> *const c_char;
    fn xdp_program__id(p: *const XdpProgram) -> u32;
    fn xdp_program__run_prio(p: *const XdpProgram) -> c_uint;
    fn xdp_program__chain_call_enabled(p: *const XdpProgram, action: c_uint) -> bool;
    fn xdp_program__attach(p: *mut XdpProgram, ifindex: c_int, mode: c_uint, flags: c_uint) -> c_int;
    fn xdp_program__detach(p: *mut XdpProgram, ifindex: c_int, mode: c_uint, flags: c_uint) -> c_int;
    fn xdp_multiprog__get_from_ifindex(ifindex: c_int) -> *mut XdpMultiprog;
    fn xdp_multiprog__next_prog(p: *const XdpProgram, mp: *const XdpMultiprog) -> *mut XdpProgram;
    fn xdp_multiprog__main_prog(mp: *const XdpMultiprog) -> *mut XdpProgram;
    fn xdp_multiprog__is_legacy(mp: *const XdpMultiprog) -> bool;
    fn xdp_multiprog__attach_mode(mp: *const XdpMultiprog) -> c_uint;
    fn xdp_multiprog__close(mp: *mut XdpMultiprog);
}

/// libxdp's attach modes.
const MODE_NATIVE: c_uint = 1;
const MODE_SKB: c_uint = 2;

/// The XDP actions, by number (names as `xdp-loader status` prints them).
const ACTIONS: [&str; 5] = ["XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT"];

/// A libxdp error: its message and errno.
#[derive(Debug, thiserror::Error)]
#[error("libxdp: {message} (error {errno})")]
pub struct Error {
    pub errno: i32,
    pub message: String,
}

impl Error {
    fn of(err: c_int) -> Self {
        let mut buf = [0 as c_char; 256];
        // SAFETY: libxdp writes a NUL-terminated message into `buf`.
        let message = unsafe {
            libxdp_strerror(err, buf.as_mut_ptr(), buf.len());
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
        };
        Self { errno: -err, message }
    }
}

/// The error of a pointer libxdp returned (0 when it is a good one).
fn error_of<T>(p: *const T) -> c_int {
    // SAFETY: libxdp reads the pointer's value (and errno) only.
    c_int::try_from(unsafe { libxdp_get_error(p.cast()) }).unwrap_or(-libc::EINVAL)
}

/// One program as libxdp sees it on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub id: u32,
    /// Run priority (lower runs first); 0 for a program alone.
    pub priority: u32,
    /// The actions that go on to the next component.
    pub chain_actions: Vec<String>,
}

/// What is on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnInterface {
    Nothing,
    /// A program attached without a dispatcher.
    Alone(Component),
    /// A libxdp dispatcher (its program id), its components in run order.
    Dispatcher {
        id: u32,
        components: Vec<Component>,
        native: bool,
    },
}

/// # Safety
/// `p` is a live program of libxdp's.
unsafe fn component(p: *const XdpProgram) -> Component {
    // SAFETY: per the caller.
    unsafe {
        let name = xdp_program__name(p);
        Component {
            name: if name.is_null() { String::new() } else { CStr::from_ptr(name).to_string_lossy().into_owned() },
            id: xdp_program__id(p),
            priority: xdp_program__run_prio(p),
            chain_actions: (0..)
                .zip(ACTIONS)
                .filter(|&(a, _)| xdp_program__chain_call_enabled(p, a))
                .map(|(_, name)| name.to_owned())
                .collect(),
        }
    }
}

/// What is on interface `ifindex`.
pub fn on_interface(ifindex: u32) -> Result<OnInterface, Error> {
    let ifindex = c_int::try_from(ifindex).map_err(|_| Error::of(-libc::EINVAL))?;
    // SAFETY: libxdp returns a multiprog we close below, or an error.
    let mp = unsafe { xdp_multiprog__get_from_ifindex(ifindex) };
    match error_of(mp) {
        0 => {}
        e if e == -libc::ENOENT => return Ok(OnInterface::Nothing),
        e => return Err(Error::of(e)),
    }
    // SAFETY: `mp` is live until closed; the programs it hands out are
    // its own, read before it is closed.
    let found = unsafe {
        let main = xdp_multiprog__main_prog(mp);
        if xdp_multiprog__is_legacy(mp) {
            let mut c = component(main);
            c.priority = 0;
            c.chain_actions.clear();
            OnInterface::Alone(c)
        } else {
            let mut components = Vec::new();
            let mut p = xdp_multiprog__next_prog(std::ptr::null(), mp);
            while !p.is_null() && components.len() < 16 {
                components.push(component(p));
                p = xdp_multiprog__next_prog(p, mp);
            }
            OnInterface::Dispatcher {
                id: xdp_program__id(main),
                components,
                native: xdp_multiprog__attach_mode(mp) == MODE_NATIVE,
            }
        }
    };
    // SAFETY: closed once, not used after.
    unsafe { xdp_multiprog__close(mp) };
    Ok(found)
}

fn mode(native: bool) -> c_uint {
    if native { MODE_NATIVE } else { MODE_SKB }
}

/// A program libxdp holds, closed when dropped.
struct Program(*mut XdpProgram);

impl Program {
    fn checked(p: *mut XdpProgram) -> Result<Self, Error> {
        match error_of(p) {
            0 if !p.is_null() => Ok(Self(p)),
            0 => Err(Error::of(-libc::ENOENT)),
            e => Err(Error::of(e)),
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: ours, closed once.
        unsafe { xdp_program__close(self.0) };
    }
}

/// Add the loaded `freplace` program `prog` to `ifindex`'s dispatcher
/// (made if there is none; libxdp reads the run priority and chain actions
/// from the program's BTF: the priority was written into the object
/// before it was loaded, [`super::run_priority`], for libxdp will not set
/// it on a loaded program). Returns the component's program id.
pub fn add(prog: BorrowedFd<'_>, ifindex: u32, native: bool) -> Result<u32, Error> {
    // SAFETY: libxdp duplicates the descriptor; the result is checked.
    let p = Program::checked(unsafe { xdp_program__from_fd(prog.as_raw_fd()) })?;
    let ifindex = c_int::try_from(ifindex).map_err(|_| Error::of(-libc::EINVAL))?;
    // SAFETY: a live program, a plain call.
    match unsafe { xdp_program__attach(p.0, ifindex, mode(native), 0) } {
        0 => {}
        e => return Err(Error::of(e)),
    }
    // SAFETY: as above.
    Ok(unsafe { xdp_program__id(p.0) })
}

/// Remove the component with program id `id` from `ifindex`'s dispatcher
/// (the dispatcher goes with its last component).
pub fn remove(id: u32, ifindex: u32, native: bool) -> Result<(), Error> {
    // SAFETY: the result is checked.
    let p = Program::checked(unsafe { xdp_program__from_id(id) })?;
    let ifindex = c_int::try_from(ifindex).map_err(|_| Error::of(-libc::EINVAL))?;
    // SAFETY: a live program, a plain call.
    match unsafe { xdp_program__detach(p.0, ifindex, mode(native), 0) } {
        0 => Ok(()),
        e => Err(Error::of(e)),
    }
}

/// The id of the program pinned at `path`.
pub fn pinned_id(path: &std::path::Path) -> Result<u32, Error> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::of(-libc::EINVAL))?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let p = Program::checked(unsafe { xdp_program__from_pin(c.as_ptr()) })?;
    // SAFETY: a live program.
    Ok(unsafe { xdp_program__id(p.0) })
}
