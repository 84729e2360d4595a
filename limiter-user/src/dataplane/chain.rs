//! Sharing the interface (`--attach libxdp|auto`): the production program
//! as a component of the interface's libxdp dispatcher (see `libxdp`),
//! next to whatever else runs there (xdp-filter, xdpdump, anything
//! loaded through libxdp), instead of the interface's only program.
//!
//! The component is `limiter_chain` (an `freplace` program of the same
//! code as `limiter`, on the same maps), loaded against the object's own
//! stub `limiter_slot`, then handed to libxdp, which builds a dispatcher
//! with it in its place by run priority and swaps that in atomically.
//! A restart (or an upgrade) adds the new program before it removes the
//! old one: for the moment between the two swaps a packet is charged
//! twice, never not at all.

use std::os::fd::AsFd as _;

use aya::programs::{Extension, Xdp};
use limiter_common::programs;

use super::{AttachMode, DataPlane, LoadError, ifindex, libxdp};

/// How the program goes onto its interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Attach {
    /// The interface's only program (refused if it has one).
    #[default]
    Exclusive,
    /// A component of the interface's libxdp dispatcher (made if none).
    Libxdp,
    /// Join a dispatcher if the interface has one, else exclusive.
    Auto,
}

impl std::fmt::Display for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Exclusive => "exclusive",
            Self::Libxdp => "libxdp",
            Self::Auto => "auto",
        })
    }
}

/// The program as a dispatcher's component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chained {
    /// The component's program id.
    pub id: u32,
    pub ifindex: u32,
    pub native: bool,
    /// Its run priority (lower runs first).
    pub priority: u32,
}

/// Joining failed.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error(
        "{iface} has XDP program {name} (id {id}) attached without a dispatcher; the limiter will not replace it. Detach it (`ip link set dev {iface} xdp off`) and load it again through libxdp (`xdp-loader load {iface} FILE.o`), then start the limiter, or use --attach exclusive in its place"
    )]
    Foreign { iface: String, name: String, id: u32 },
    #[error(
        "{iface} has libxdp's dispatcher (program {id}) running {programs}; --attach exclusive would take the interface from them. Start the limiter with --attach auto (or libxdp) to join them, or unload them first (`xdp-loader unload {iface} --all`)"
    )]
    DispatcherThere { iface: String, id: u32, programs: String },
    #[error("{iface}'s dispatcher is attached in {theirs} mode; start the limiter with --mode {theirs}")]
    OtherMode { iface: String, theirs: AttachMode },
    #[error("reading {iface}'s XDP programs")]
    Query {
        iface: String,
        #[source]
        source: libxdp::Error,
    },
    #[error("joining {iface}'s dispatcher")]
    Join {
        iface: String,
        #[source]
        source: libxdp::Error,
    },
    #[error("loading limiter_chain against its stub")]
    Load(#[source] aya::programs::ProgramError),
    #[error(
        "this kernel refuses freplace (BPF_PROG_TYPE_EXT) programs (EPERM), so no libxdp dispatcher can run on it (libxdp itself falls back to one program alone: `xdp-loader status` shows no priorities); start with --attach exclusive"
    )]
    NoFreplace,
    #[error(
        "this kernel ({release}) refuses a dispatcher component that changes packet data (the limiter's SYN-cookie replies) in a slot that does not (\"Extension program changes packet data, while original does not\"), and the dispatcher of the libxdp this build uses has such slots; start with --attach exclusive"
    )]
    PacketDataSlot { release: String },
}

/// Whether `c` is a limiter's component.
fn ours(c: &libxdp::Component) -> bool {
    c.name == programs::LIMITER_CHAIN
}

impl DataPlane {
    /// Whether `attach` puts the program into `iface`'s dispatcher (else
    /// it attaches alone): `auto` joins a dispatcher if there is one; both
    /// `auto` and `libxdp` refuse a foreign program attached without one
    /// (an exclusive limiter's own is left to the exclusive path, which
    /// re-adopts its pinned link).
    pub fn chained(iface: &str, attach: Attach) -> Result<bool, LoadError> {
        let ifindex = ifindex(iface)?;
        if attach == Attach::Exclusive {
            // Never over a dispatcher: its programs are someone's (a
            // limiter's own component is taken out by a start that joins).
            // An interface libxdp cannot read is left to the attach itself.
            if let Ok(libxdp::OnInterface::Dispatcher { id, components, .. }) = libxdp::on_interface(ifindex)
                && components.iter().any(|c| !ours(c))
            {
                let programs = components
                    .iter()
                    .map(|c| format!("{} (id {}, priority {})", crate::escape_control(&c.name), c.id, c.priority))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(LoadError::Chain(ChainError::DispatcherThere { iface: iface.into(), id, programs }));
            }
            return Ok(false);
        }
        let on = libxdp::on_interface(ifindex)
            .map_err(|source| LoadError::Chain(ChainError::Query { iface: iface.into(), source }))?;
        match on {
            libxdp::OnInterface::Dispatcher { .. } => Ok(true),
            libxdp::OnInterface::Nothing => Ok(attach == Attach::Libxdp),
            libxdp::OnInterface::Alone(c) if c.name == programs::LIMITER => Ok(false),
            libxdp::OnInterface::Alone(c) => {
                Err(LoadError::Chain(ChainError::Foreign { iface: iface.into(), name: c.name, id: c.id }))
            }
        }
    }

    /// Load `limiter_chain` (once), against the stub in `limiter_slot_host`.
    fn load_chain(&mut self) -> Result<(), LoadError> {
        let loaded = self.ebpf.program(programs::LIMITER_CHAIN).is_some_and(|p| p.fd().is_ok());
        if loaded {
            return Ok(());
        }
        self.load_program(programs::LIMITER_SLOT_HOST)?;
        let host: &mut Xdp = self
            .ebpf
            .program_mut(programs::LIMITER_SLOT_HOST)
            .and_then(|p| p.try_into().ok())
            .ok_or(LoadError::MissingProgram(programs::LIMITER_SLOT_HOST))?;
        let target = host.fd().map_err(|e| LoadError::Chain(ChainError::Load(e)))?;
        let target = target.try_clone().map_err(|e| LoadError::Chain(ChainError::Load(e.into())))?;
        let ext: &mut Extension = self
            .ebpf
            .program_mut(programs::LIMITER_CHAIN)
            .and_then(|p| p.try_into().ok())
            .ok_or(LoadError::MissingProgram(programs::LIMITER_CHAIN))?;
        ext.load(target, "limiter_slot").map_err(|e| match &e {
            aya::programs::ProgramError::LoadError { io_error, .. } if io_error.raw_os_error() == Some(libc::EPERM) => {
                LoadError::Chain(ChainError::NoFreplace)
            }
            aya::programs::ProgramError::LoadError { verifier_log, .. }
                if format!("{verifier_log:?}")
                    .contains("Extension program changes packet data, while original does not") =>
            {
                LoadError::Chain(ChainError::PacketDataSlot { release: super::kernel::release() })
            }
            aya::programs::ProgramError::LoadError { .. } => {
                super::kernel::refusal::verify_error(programs::LIMITER_CHAIN, e)
            }
            _ => LoadError::Chain(ChainError::Load(e)),
        })
    }

    /// Add this build's program to `iface`'s dispatcher (made if there is
    /// none), then take out any limiter component that was there before
    /// (a restart, an upgrade). Refuses a program attached without a
    /// dispatcher, and a dispatcher of the other mode.
    pub fn join(&mut self, iface: &str, mode: AttachMode, priority: u32) -> Result<Chained, LoadError> {
        let err = |e: ChainError| LoadError::Chain(e);
        let ifindex = ifindex(iface)?;
        let native = mode == AttachMode::Native;
        let before =
            libxdp::on_interface(ifindex).map_err(|source| err(ChainError::Query { iface: iface.into(), source }))?;
        let old: Vec<u32> = match &before {
            libxdp::OnInterface::Nothing => Vec::new(),
            libxdp::OnInterface::Alone(c) => {
                return Err(err(ChainError::Foreign { iface: iface.into(), name: c.name.clone(), id: c.id }));
            }
            libxdp::OnInterface::Dispatcher { components, native: theirs, .. } => {
                if *theirs != native {
                    let theirs = if *theirs { AttachMode::Native } else { AttachMode::Generic };
                    return Err(err(ChainError::OtherMode { iface: iface.into(), theirs }));
                }
                components.iter().filter(|c| ours(c)).map(|c| c.id).collect()
            }
        };
        self.load_chain()?;
        let ext =
            self.ebpf.program(programs::LIMITER_CHAIN).ok_or(LoadError::MissingProgram(programs::LIMITER_CHAIN))?;
        let fd = ext.fd().map_err(|e| err(ChainError::Load(e)))?;
        let id = libxdp::add(fd.as_fd(), ifindex, native)
            .map_err(|source| err(ChainError::Join { iface: iface.into(), source }))?;
        for o in old.into_iter().filter(|&o| o != id) {
            match libxdp::remove(o, ifindex, native) {
                Ok(()) => {
                    tracing::info!("limiter: the earlier limiter component (program {o}) left {iface}'s dispatcher");
                }
                Err(e) => tracing::warn!("limiter: the earlier limiter component (program {o}) on {iface}: {e}"),
            }
        }
        Ok(Chained { id, ifindex, native, priority })
    }
}

/// Whether component `c` is still in its interface's dispatcher: `None`
/// when libxdp cannot say.
#[must_use]
pub fn present(c: &Chained) -> Option<bool> {
    match libxdp::on_interface(c.ifindex).ok()? {
        libxdp::OnInterface::Dispatcher { components, .. } => Some(components.iter().any(|p| p.id == c.id)),
        _ => Some(false),
    }
}

/// Take component `c` out of its dispatcher.
pub fn leave(c: &Chained) -> Result<(), libxdp::Error> {
    libxdp::remove(c.id, c.ifindex, c.native)
}

/// Take the component pinned at `prog` (a pinned daemon's program) out of
/// whichever interface's dispatcher holds it, for `limiter unload`: the
/// pins alone would not detach it (libxdp pins it too). Returns the
/// interface it left, if any.
#[must_use]
pub fn leave_pinned(prog: &std::path::Path) -> Left {
    let Ok(id) = libxdp::pinned_id(prog) else { return Left::NotComponent };
    // SAFETY: if_nameindex's array, freed once, read before.
    let names: Vec<(u32, String)> = unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Left::NotComponent;
        }
        let mut out = Vec::new();
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            out.push(((*p).if_index, std::ffi::CStr::from_ptr((*p).if_name).to_string_lossy().into_owned()));
            p = p.add(1);
        }
        libc::if_freenameindex(list);
        out
    };
    let left = names.into_iter().find_map(|(ifindex, name)| {
        let libxdp::OnInterface::Dispatcher { components, native, .. } = libxdp::on_interface(ifindex).ok()? else {
            return None;
        };
        components.iter().any(|c| c.id == id).then_some(())?;
        match libxdp::remove(id, ifindex, native) {
            Ok(()) => Some(name),
            Err(e) => {
                tracing::warn!("limiter: taking program {id} out of {name}'s dispatcher: {e}");
                None
            }
        }
    });
    match left {
        Some(iface) => Left::Left(iface),
        None if is_component(id) => Left::Elsewhere(id),
        None => Left::NotComponent,
    }
}

/// What [`leave_pinned`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Left {
    /// The component left this interface's dispatcher.
    Left(String),
    /// A component still attached, in no dispatcher of this network
    /// namespace (another one's).
    Elsewhere(u32),
    /// Not a component (an exclusive limiter's program), or no longer one.
    NotComponent,
}

/// Whether program `id` is a limiter component still loaded (the
/// extension program; an exclusive limiter's is `limiter`).
fn is_component(id: u32) -> bool {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .any(|p| p.id() == id && p.name_as_str() == Some(programs::LIMITER_CHAIN))
}
