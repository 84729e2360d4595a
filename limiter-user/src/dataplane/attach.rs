//! The program's attachment to its interface, watched: the daemon keeps a
//! descriptor of its own on the XDP link and reads the link's interface
//! from `/proc/self/fdinfo` (0 once the link lost it: interface deleted,
//! `bpftool link detach`), and checks that a pinned link is still pinned
//! (`limiter unload --force`). What is lost is put back: a new link, or
//! the pin again. Until then the daemon reports itself detached; it never
//! claims protection that is not there.

use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, PinnedLink};
use limiter_common::programs;

use super::{
    DataPlane, LoadError,
    chain::{self, Chained},
    ifindex, pin, upgrade,
};

/// The program on its interface.
pub struct Attachment {
    /// Our own descriptor on the link (`None` once lost). Unpinned,
    /// dropping it detaches.
    link: Option<FdLink>,
    /// The descriptor number of `link` (aya does not expose it).
    fd: Option<i32>,
    iface: String,
    mode: AttachMode,
    /// The pin directory, when the link (or, chained, the maps) is
    /// pinned there.
    pin_dir: Option<PathBuf>,
    /// A component of the interface's libxdp dispatcher, not a link of
    /// its own (`--attach libxdp`).
    chained: Option<Chained>,
}

/// What a check of the attachment found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Attached,
    /// Not enforcing, and why.
    Detached(String),
}

impl Attachment {
    /// Interface index the link is attached to (0 = none); `None` when the
    /// kernel does not say.
    fn link_ifindex(&self) -> Option<u32> {
        let (Some(_), Some(fd)) = (&self.link, self.fd) else { return Some(0) };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
        fdinfo_field(&info, "ifindex")
    }

    fn new(link: FdLink, iface: &str, mode: AttachMode, pin_dir: Option<PathBuf>) -> Self {
        let mut a = Self { link: None, fd: None, iface: iface.into(), mode, pin_dir, chained: None };
        a.set_link(link);
        a
    }

    fn set_link(&mut self, link: FdLink) {
        self.fd = link.info().ok().and_then(|i| descriptor_of(i.id()));
        self.link = Some(link);
    }

    fn link_pin(&self) -> Option<PathBuf> {
        self.pin_dir.as_ref().filter(|_| self.chained.is_none()).map(|d| d.join(pin::LINK))
    }

    /// The dispatcher component, when chained.
    #[must_use]
    pub fn chained(&self) -> Option<Chained> {
        self.chained
    }

    /// Whether the program is attached (and pinned, if it should be).
    #[must_use]
    pub fn health(&self) -> Health {
        if let Some(c) = &self.chained {
            return match chain::present(c) {
                Some(false) => Health::Detached(format!(
                    "the limiter's component (program {}) is no longer in {}'s dispatcher (removed by another tool)",
                    c.id, self.iface
                )),
                _ => Health::Attached,
            };
        }
        if self.link_ifindex() == Some(0) {
            return Health::Detached(format!(
                "the XDP link lost {} (interface gone, or detached by another tool)",
                self.iface
            ));
        }
        if let Some(p) = self.link_pin()
            && !p.exists()
        {
            return Health::Detached(format!("the link's pin {} was removed", p.display()));
        }
        Health::Attached
    }

    /// The pin directory, if pinned.
    #[must_use]
    pub fn pin_dir(&self) -> Option<&Path> {
        self.pin_dir.as_deref()
    }

    /// Whether the link is pinned now (so it outlives this process); a
    /// dispatcher's component is pinned by libxdp, and outlives this
    /// process when the maps are pinned.
    #[must_use]
    pub fn is_pinned(&self) -> bool {
        if self.chained.is_some() {
            return self.pin_dir.is_some();
        }
        self.link_pin().is_some_and(|p| p.exists())
    }
}

impl Drop for Attachment {
    /// An unpinned component leaves its dispatcher with the daemon, as an
    /// unpinned link does (libxdp's pins would keep it there otherwise).
    fn drop(&mut self) {
        if let (Some(c), None) = (&self.chained, &self.pin_dir)
            && let Err(e) = chain::leave(c)
        {
            tracing::warn!("limiter: leaving {}'s dispatcher: {e}", self.iface);
        }
    }
}

impl DataPlane {
    /// Attach the production entry point with a link of its own (not
    /// pinned: it is detached when the attachment is dropped).
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<Attachment, LoadError> {
        let link = self.new_link(iface, mode)?;
        Ok(Attachment::new(link, iface, mode, None))
    }

    fn new_link(&mut self, iface: &str, mode: AttachMode) -> Result<FdLink, LoadError> {
        let id = self.attach_program(programs::LIMITER, iface, mode)?;
        let link = self.xdp(programs::LIMITER)?.take_link(id).map_err(|source| LoadError::Attach {
            iface: iface.into(),
            mode,
            source,
        })?;
        FdLink::try_from(link).map_err(LoadError::Adopt)
    }

    /// Attach with the link and program pinned in `dir`. If a link is
    /// pinned already, this build's program replaces the old one on it
    /// atomically (`bpf_link_update`): no moment without enforcement.
    /// Returns the attachment and whether an existing link was re-adopted.
    pub fn attach_pinned(
        &mut self,
        iface: &str,
        mode: AttachMode,
        dir: &Path,
    ) -> Result<(Attachment, bool), LoadError> {
        let ifindex = ifindex(iface)?;
        let mut meta = self.maps.tables().meta()?;
        let link_path = dir.join(pin::LINK);
        if meta.ifindex != 0 && meta.ifindex != ifindex && link_path.exists() {
            return Err(LoadError::OtherInterface {
                dir: dir.display().to_string(),
                pinned: meta.ifindex,
                iface: iface.into(),
            });
        }
        self.load_program(programs::LIMITER)?;
        let replaced = link_path.exists();
        if replaced {
            let pinned = PinnedLink::from_pin(&link_path).map_err(LoadError::Adopt)?;
            let link = aya::programs::xdp::XdpLink::try_from(FdLink::from(pinned)).map_err(LoadError::Adopt)?;
            self.xdp(programs::LIMITER)?.attach_to_link(link).map_err(LoadError::Replace)?;
        } else {
            self.pin_new_link(iface, mode, &link_path)?;
        }
        let prog_path = dir.join(pin::PROG);
        let _ = std::fs::remove_file(&prog_path);
        self.xdp(programs::LIMITER)?
            .pin(&prog_path)
            .map_err(|source| LoadError::PinObject { what: "program", source })?;
        // The old program is off the link: renewed maps take the old pins'
        // names, and `META` says the pins are this build's from now on.
        for name in upgrade::finish_renewal(dir, &std::mem::take(&mut self.renewing))? {
            tracing::info!(event = "retired", map = name, "limiter: pinned {name} removed (an earlier build's map)");
        }
        upgrade::write_layout(dir)?;
        meta.ifindex = ifindex;
        meta.schema = limiter_common::SCHEMA_VERSION;
        self.maps.tables().set_meta(&meta)?;
        let link = FdLink::from(PinnedLink::from_pin(&link_path).map_err(LoadError::Adopt)?);
        Ok((Attachment::new(link, iface, mode, Some(dir.into())), replaced))
    }

    /// Join `iface`'s libxdp dispatcher ([`chain`]); with `dir`, the maps
    /// are pinned there and the component outlives the daemon (libxdp pins
    /// it), and the program is pinned in `dir` too, so `limiter unload`
    /// finds it. Returns the attachment and whether an earlier limiter
    /// component was replaced.
    pub fn attach_chained(
        &mut self,
        iface: &str,
        mode: AttachMode,
        dir: Option<&Path>,
        priority: u32,
    ) -> Result<(Attachment, bool), LoadError> {
        let ifindex = ifindex(iface)?;
        if let Some(dir) = dir {
            let meta = self.maps.tables().meta()?;
            if meta.ifindex != 0 && meta.ifindex != ifindex {
                return Err(LoadError::OtherInterface {
                    dir: dir.display().to_string(),
                    pinned: meta.ifindex,
                    iface: iface.into(),
                });
            }
        }
        let before = dir.and_then(|d| libxdp_pinned_id(&d.join(pin::PROG)));
        let c = self.join(iface, mode, priority)?;
        let mut a = Self::chained_attachment(iface, mode, dir, c);
        let Some(dir) = dir else { return Ok((a, false)) };
        let prog_path = dir.join(pin::PROG);
        let _ = std::fs::remove_file(&prog_path);
        self.ebpf
            .program_mut(limiter_common::programs::LIMITER_CHAIN)
            .ok_or(LoadError::MissingProgram(limiter_common::programs::LIMITER_CHAIN))?
            .pin(&prog_path)
            .map_err(|source| LoadError::PinObject { what: "program", source })?;
        for name in upgrade::finish_renewal(dir, &std::mem::take(&mut self.renewing))? {
            tracing::info!(event = "retired", map = name, "limiter: pinned {name} removed (an earlier build's map)");
        }
        upgrade::write_layout(dir)?;
        let mut meta = self.maps.tables().meta()?;
        meta.ifindex = ifindex;
        meta.schema = limiter_common::SCHEMA_VERSION;
        self.maps.tables().set_meta(&meta)?;
        a.pin_dir = Some(dir.into());
        Ok((a, before.is_some()))
    }

    fn chained_attachment(iface: &str, mode: AttachMode, dir: Option<&Path>, c: Chained) -> Attachment {
        Attachment { link: None, fd: None, iface: iface.into(), mode, pin_dir: dir.map(Into::into), chained: Some(c) }
    }

    fn pin_new_link(&mut self, iface: &str, mode: AttachMode, link_path: &Path) -> Result<(), LoadError> {
        let link = self.new_link(iface, mode)?;
        link.pin(link_path).map_err(|source| LoadError::PinObject { what: "link", source })?;
        Ok(())
    }

    /// Put back what the attachment lost: a new link if the old one lost
    /// its interface, the pin if only the pin is gone. Returns what was
    /// done; an error while the interface is still missing.
    pub fn repair(&mut self, a: &mut Attachment) -> Result<String, LoadError> {
        let (iface, mode) = (a.iface.clone(), a.mode);
        if let Some(c) = a.chained {
            let c = self.join(&iface, mode, c.priority)?;
            a.chained = Some(c);
            return Ok(format!("joined {iface}'s dispatcher again (program {})", c.id));
        }
        match (a.link_ifindex() == Some(0), a.link_pin()) {
            (true, None) => {
                a.set_link(self.new_link(&iface, mode)?);
                Ok(format!("attached to {iface} again with a new link"))
            }
            (true, Some(pin)) => {
                let _ = std::fs::remove_file(&pin);
                self.pin_new_link(&iface, mode, &pin)?;
                a.set_link(FdLink::from(PinnedLink::from_pin(&pin).map_err(LoadError::Adopt)?));
                Ok(format!("attached to {iface} again with a new link, pinned at {}", pin.display()))
            }
            (false, Some(pin)) => {
                // Our descriptor kept the link alive: pin it again. If that
                // fails the descriptor is gone too, and the next repair
                // makes a new link.
                let Some(link) = a.link.take() else { return Ok("nothing to repair".into()) };
                let pinned = link.pin(&pin).map_err(|source| LoadError::PinObject { what: "link", source })?;
                a.set_link(FdLink::from(pinned));
                Ok(format!("pinned the link again at {}", pin.display()))
            }
            (false, None) => Ok("nothing to repair".into()),
        }
    }
}

/// The id of the program pinned at `path`, if one is.
fn libxdp_pinned_id(path: &Path) -> Option<u32> {
    path.exists().then(|| super::libxdp::pinned_id(path).ok()).flatten()
}

/// A numeric field of an fdinfo text.
fn fdinfo_field(info: &str, name: &str) -> Option<u32> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| v.trim().parse().ok())
}

/// A descriptor of this process on the BPF link `id`.
fn descriptor_of(id: u32) -> Option<i32> {
    std::fs::read_dir("/proc/self/fdinfo").ok()?.flatten().find_map(|e| {
        let fd: i32 = e.file_name().to_str()?.parse().ok()?;
        let info = std::fs::read_to_string(e.path()).ok()?;
        (fdinfo_field(&info, "link_id") == Some(id)).then_some(fd)
    })
}

#[cfg(test)]
mod tests {
    use super::fdinfo_field;

    #[test]
    fn fdinfo_fields_are_read_by_name() {
        let info = "pos:\t0\nlink_type:\txdp\nlink_id:\t112\nprog_id:\t408\nifindex:\t3\n";
        assert_eq!(fdinfo_field(info, "ifindex"), Some(3));
        assert_eq!(fdinfo_field(info, "link_id"), Some(112));
        assert_eq!(fdinfo_field(info, "missing"), None);
    }
}

/// How the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// In the driver (XDP_FLAGS_DRV_MODE): the fast path.
    Native,
    /// In the generic network stack (XDP_FLAGS_SKB_MODE): works everywhere.
    Generic,
}

impl AttachMode {
    pub(super) fn xdp(self) -> aya::programs::XdpMode {
        match self {
            Self::Native => aya::programs::XdpMode::Driver,
            Self::Generic => aya::programs::XdpMode::Skb,
        }
    }
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Generic => "generic",
        })
    }
}
