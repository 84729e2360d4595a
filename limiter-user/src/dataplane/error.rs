//! What went wrong loading, attaching or touching the maps.

use std::path::PathBuf;

use aya::programs::ProgramError;

use super::{AttachMode, chain, kernel, pin};

/// What went wrong loading, attaching or touching the maps.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the XDP object")]
    Object(#[source] aya::EbpfError),
    #[error("program {0} missing from the object")]
    MissingProgram(&'static str),
    #[error("map {0} missing from the object")]
    MissingMap(&'static str),
    /// The verifier refused the program: one line (function, instruction,
    /// reason), the whole log in a file. The raw log is not a cause, so
    /// that `{:#}` never prints it.
    #[error(
        "the kernel's verifier ({release}) refused program {name} {summary}{}{}",
        log.as_ref().map_or_else(String::new, |p| format!("; its whole log: {}", p.display())),
        kernel::older_note(release)
    )]
    Refused {
        name: &'static str,
        release: String,
        summary: String,
        log: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    #[error("loading program {name} into the kernel (verifier)")]
    Verify {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("interface {iface} does not exist")]
    NoInterface { iface: String },
    #[error(
        "{iface} already has an XDP program attached (another limiter, or another tool); remove it first (`limiter unload --pin-dir DIR`, or `ip link set dev {iface} xdp off`)"
    )]
    Busy {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error(
        "attaching to {iface} in native mode failed; the driver may not support native XDP, retry with --mode generic"
    )]
    NativeUnsupported {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error("attaching to {iface} in {mode} mode")]
    Attach {
        iface: String,
        mode: AttachMode,
        #[source]
        source: ProgramError,
    },
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Pin(#[from] pin::PinError),
    #[error("pinned state in {dir} belongs to interface index {pinned}, not {iface}")]
    OtherInterface { dir: String, pinned: u32, iface: String },
    #[error("pinning {what}")]
    PinObject {
        what: &'static str,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("re-adopting the pinned link")]
    Adopt(#[source] aya::programs::links::LinkError),
    #[error("replacing the program on the pinned link")]
    Replace(#[source] ProgramError),
    #[error(transparent)]
    Chain(#[from] chain::ChainError),
    #[error("test run of {name}")]
    TestRun {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
}

/// A map operation's error, named.
pub(crate) trait Named<T> {
    fn on(self, map: &'static str) -> Result<T, LoadError>;
}

impl<T> Named<T> for Result<T, aya::maps::MapError> {
    fn on(self, map: &'static str) -> Result<T, LoadError> {
        self.map_err(|source| LoadError::Map { map, source })
    }
}
