//! How the daemon is to run, from `limiter run`'s arguments, and the
//! policy they name.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{
    dataplane::AttachMode,
    policy::{self, Loaded, Overlay, PolicyError},
};

/// How the daemon is to run (from `limiter run`'s arguments).
#[derive(Clone, Debug)]
pub struct Settings {
    pub iface: String,
    pub mode: AttachMode,
    /// Exclusive, or a libxdp dispatcher's component (`--attach`).
    pub attach: crate::dataplane::chain::Attach,
    /// Run priority under a libxdp dispatcher (`--priority`).
    pub priority: u32,
    /// Pin under this directory (`--pin`).
    pub pin_dir: Option<PathBuf>,
    pub socket: PathBuf,
    /// Group (name or gid) allowed on the control socket besides root.
    pub socket_group: Option<String>,
    pub metrics: Option<SocketAddr>,
    /// Between status lines; `None` = no status lines.
    pub status_interval: Option<Duration>,
    /// `--policy`; else the default path if a file is there.
    pub policy: Option<PathBuf>,
    pub overlay: Overlay,
    /// The audit trail's history file (`--history`; none: the log only).
    pub history: Option<PathBuf>,
    /// The attacks file (`--attacks`; none: the log and memory only).
    pub attacks: Option<PathBuf>,
}

impl Settings {
    /// The policy to enforce: the file (or the built-in policy) with the
    /// command-line flags laid over it.
    pub fn load_policy(&self) -> Result<Loaded, PolicyError> {
        let mut loaded = match policy::resolve_path(self.policy.as_deref()) {
            Some(path) => policy::file::read(&path)?,
            None => Loaded::built_in(),
        };
        loaded.policy = self.overlay.apply(loaded.policy)?;
        Ok(loaded)
    }
}
