//! The data plane as userspace sees it: the XDP object loaded (and its
//! maps pinned, with `--pin`), attached to an interface, and its maps
//! behind typed handles (`maps`). The daemon writes policy through the
//! [`PolicyMaps`] trait, which an in-memory fake also implements so the
//! daemon's logic is tested on the host.

mod attach;
pub mod chain;
pub mod counters;
pub mod deny;
mod error;
pub mod groups;
pub mod kernel;
pub mod libxdp;
pub mod maps;
pub mod pin;
mod port;
mod rawmap;
pub mod run_priority;
#[cfg(feature = "testing")]
pub mod testing;
pub mod upgrade;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData, RingBuf},
    programs::{ProgramError, TestRun as _, TestRunOptions, Xdp, xdp::XdpLinkId},
};
/// XDP actions (`XDP_PASS`, `XDP_DROP`, ...) as the kernel defines them.
pub use aya_ebpf_bindings::bindings::xdp_action;
use limiter_common::{META_MAGIC, Meta, SCHEMA_VERSION, maps as names, programs};

#[cfg(any(test, feature = "testing"))]
pub use self::port::FakeMaps;
pub use self::{
    attach::{AttachMode, Attachment, Health},
    counters::Totals,
    error::LoadError,
    maps::Maps,
    port::PolicyMaps,
};

/// The production object, built by `build.rs` from `limiter-ebpf`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter.bpf.o"));

/// The object without SYN cookies (limiter-ebpf's `without-syn-cookies`
/// feature), for kernels without their helpers: see [`kernel::Program`].
pub static OBJECT_WITHOUT_SYN_COOKIES: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-without-syn-cookies.bpf.o"));

/// The frames the program copies (`CAPTURES`) and the switch that has
/// it copy them (`CAPTURE`).
pub struct Capture {
    pub frames: RingBuf<MapData>,
    pub ctl: Array<MapData, limiter_common::capture::CaptureCtl>,
    /// The program's globals: `LIMITER_PASSES` (see `maps::GLOBALS`).
    pub passes: Array<MapData, u32>,
}

/// A loaded XDP object and its maps.
pub struct DataPlane {
    ebpf: Ebpf,
    pub maps: Maps,
    drop_events: Option<RingBuf<MapData>>,
    /// The captured frames' ring and its switch.
    capture: Option<Capture>,
    /// The pin directory's lock, held while this data plane lives (never
    /// read: the lock lives as long as the file).
    pin_lock: Option<std::fs::File>,
    /// Renewed maps, pinned beside the old ones until the program is on
    /// the link.
    renewing: Vec<upgrade::Renewal>,
    /// See [`DataPlane::carried_version`].
    carried_version: u64,
    /// Which object this is, and what the kernel lacks for the rest.
    pub kernel: kernel::Plan,
}

/// `AYA_LOG_LEVEL` for the program: its debug lines are compiled in but
/// stay off unless the daemon itself logs at debug level.
fn ebpf_log_level() -> u8 {
    let debug = tracing::level_filters::LevelFilter::current() >= tracing::level_filters::LevelFilter::DEBUG;
    if debug { aya_log::Level::Debug as u8 } else { aya_log::Level::Info as u8 }
}

impl DataPlane {
    /// Load the production object with a bucket map of `capacity` entries.
    /// Programs are verified lazily by [`DataPlane::load_program`].
    pub fn open(capacity: u32) -> Result<Self, LoadError> {
        Self::open_program(capacity, kernel::Plan::default())
    }

    /// [`DataPlane::open`] of the object `plan` names.
    pub fn open_program(capacity: u32, plan: kernel::Plan) -> Result<Self, LoadError> {
        let object = run_priority::Object::of(&plan);
        let mut d = Self::load(object.bytes(), capacity, None, &[])?;
        d.kernel = plan;
        Ok(d)
    }

    /// Load `object`; with `pin_dir`, its maps are pinned there (and pinned
    /// maps already there are re-adopted as they are), but for those in
    /// `renew`, made new and pinned beside the old ones (see
    /// [`pin::new_pin`]) until [`DataPlane::attach_pinned`] puts them
    /// in place.
    fn load(
        object: &[u8],
        capacity: u32,
        pin_dir: Option<&Path>,
        renew: &[upgrade::Renewal],
    ) -> Result<Self, LoadError> {
        let level = ebpf_log_level();
        let paths: Vec<(&'static str, PathBuf)> = pin_dir
            .map(|dir| {
                pin::PINNED_MAPS
                    .iter()
                    .map(|m| {
                        let renewed = renew.iter().any(|r| r.name == m.name);
                        (m.name, if renewed { pin::new_pin(dir, m.name) } else { dir.join(m.name) })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut loader = EbpfLoader::new();
        for m in limiter_common::maps::TABLE.iter().filter(|m| m.by_capacity) {
            loader.map_max_entries(m.name, capacity);
        }
        loader.override_global(aya_log::LEVEL, &level, true);
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(object).map_err(LoadError::Object)?;
        let maps = Maps::take(&mut ebpf)?;
        let drop_events = ebpf.take_map(names::DROP_EVENTS).and_then(|m| RingBuf::try_from(m).ok());
        let frames = ebpf.take_map(names::CAPTURES).and_then(|m| RingBuf::try_from(m).ok());
        let ctl = ebpf.take_map(names::CAPTURE).and_then(|m| Array::try_from(m).ok());
        let passes = ebpf.take_map(names::GLOBALS).and_then(|m| Array::try_from(m).ok());
        let capture = frames.zip(ctl).zip(passes).map(|((frames, ctl), passes)| Capture { frames, ctl, passes });
        Ok(Self {
            ebpf,
            maps,
            drop_events,
            capture,
            pin_lock: None,
            renewing: Vec::new(),
            carried_version: 0,
            kernel: kernel::Plan::default(),
        })
    }

    /// Load the object with its maps pinned in `dir`, re-adopting pinned
    /// maps (buckets, counters and config kept) after checking them
    /// against this build's schema; a pinned map of an older build's
    /// layout is renewed instead ([`upgrade::plan`]), and the old one keeps
    /// serving the old program until this one replaces it on the link.
    /// Returns the data plane and, when maps were adopted, the renewals.
    pub fn open_pinned(
        capacity: u32,
        dir: &Path,
        plan: kernel::Plan,
    ) -> Result<(Self, Option<Vec<upgrade::Renewal>>), LoadError> {
        pin::ensure_dir(dir)?;
        let lock = pin::lock_dir(dir)?;
        pin::remove_unfinished(dir);
        let adoption = upgrade::check(dir)?;
        let adopted = adoption.is_some();
        let mut renew = adoption.unwrap_or_default();
        let object = run_priority::Object::of(&plan);
        let mut d = Self::load(object.bytes(), capacity, Some(dir), &renew)?;
        d.kernel = plan;
        // Maps of the same layout, only longer or shorter, keep what they
        // hold. Copied before the swap: the old program counts on into
        // the old map until then.
        for r in renew.iter_mut().filter(|r| r.copy) {
            match upgrade::copy_entries(&dir.join(r.name), &pin::new_pin(dir, r.name)) {
                Ok(n) => r.copied = Some(n),
                Err(e) => tracing::warn!("limiter: copying pinned {} into its renewal: {e}", r.name),
            }
        }
        d.pin_lock = Some(lock);
        if renew.iter().any(|r| r.name == names::CONFIG) {
            d.carried_version = upgrade::pinned_config_version(&dir.join(names::CONFIG));
        }
        if !adopted {
            d.maps.tables().set_meta(&Meta { magic: META_MAGIC, schema: SCHEMA_VERSION, ifindex: 0, pad: 0 })?;
        }
        d.renewing.clone_from(&renew);
        Ok((d, adopted.then_some(renew)))
    }

    /// The policy version a renewed `CONFIG` held (0 if none was renewed):
    /// versions continue from it.
    #[must_use]
    pub fn carried_version(&self) -> u64 {
        self.carried_version
    }

    fn xdp(&mut self, name: &'static str) -> Result<&mut Xdp, LoadError> {
        self.ebpf.program_mut(name).and_then(|p| p.try_into().ok()).ok_or(LoadError::MissingProgram(name))
    }

    /// Capacity of the bucket map in use.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.maps.counters.bucket_capacity
    }

    /// Kernel id of the bucket map (for a second, independent handle).
    #[must_use]
    pub fn buckets_map_id(&self) -> u32 {
        self.maps.counters.buckets_id
    }

    /// Run the verifier on one entry point (idempotent).
    pub fn load_program(&mut self, name: &'static str) -> Result<(), LoadError> {
        let prog = self.xdp(name)?;
        if prog.fd().is_ok() {
            return Ok(());
        }
        prog.load().map_err(|source| kernel::refusal::verify_error(name, source))
    }

    /// Attach an entry point; the link lives as long as `self`.
    fn attach_program(&mut self, name: &'static str, iface: &str, mode: AttachMode) -> Result<XdpLinkId, LoadError> {
        self.load_program(name)?;
        let prog = self.xdp(name)?;
        prog.attach(iface, mode.xdp()).map_err(|source| match source {
            ProgramError::UnknownInterface { .. } => LoadError::NoInterface { iface: iface.into() },
            ProgramError::SyscallError(ref e)
                if matches!(e.io_error.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)) =>
            {
                LoadError::Busy { iface: iface.into(), source }
            }
            source if mode == AttachMode::Native => LoadError::NativeUnsupported { iface: iface.into(), source },
            source => LoadError::Attach { iface: iface.into(), mode, source },
        })
    }

    /// The eBPF log forwarder (aya-log into `log`, which `tracing` picks
    /// up). `None` if it cannot start.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.ebpf).ok()
    }

    /// The captured frames' ring and its switch, taken out (once).
    pub fn take_capture(&mut self) -> Option<Capture> {
        self.capture.take()
    }

    /// The sampled-drop ring buffer, taken out (once).
    pub fn take_drop_events(&mut self) -> Option<RingBuf<MapData>> {
        self.drop_events.take()
    }

    /// Put the wall clock the window quotas number their slices by
    /// `offset` ns ahead of the injected clock (the daemon keeps it at the
    /// wall clock's offset from the monotonic one).
    pub fn set_wall_offset(&mut self, offset: u64) -> Result<(), LoadError> {
        let Some(w) = &mut self.maps.windows else { return Ok(()) };
        error::Named::on(
            w.state.set(limiter_common::window::FleetSlot::WallOffset.index(), offset, 0),
            limiter_common::maps::FLEET_STATE,
        )
    }

    /// Run one frame through the injected-clock entry point at `now_ns`
    /// (offline: `limiter replay`). Returns the XDP action.
    pub fn run_at(&mut self, now_ns: u64, frame: &[u8]) -> Result<u32, LoadError> {
        self.maps.tables().set_test_clock(now_ns)?;
        let opts = TestRunOptions { data_in: Some(frame), repeat: 1, ..TestRunOptions::new() };
        Ok(self.run_with(programs::LIMITER_TEST_CLOCK, opts)?.0)
    }

    fn run_with(
        &mut self,
        name: &'static str,
        opts: TestRunOptions<'_>,
    ) -> Result<(u32, std::time::Duration), LoadError> {
        self.load_program(name)?;
        let r = self.xdp(name)?.test_run(opts).map_err(|source| LoadError::TestRun { name, source })?;
        Ok((r.return_value, r.duration))
    }
}

/// Tracked prefixes: the entries of the bucket map `map`, counted in
/// batches (a few hundred system calls for a million prefixes); by
/// walking its keys where the kernel refuses batches.
#[must_use]
pub fn tracked_prefixes(map: &aya::maps::MapData) -> usize {
    rawmap::count_entries(map).unwrap_or_else(|_| walk_keys(map))
}

/// The entries of a bucket map, by walking its keys (one system call
/// each). Bounded by the map's capacity: a key evicted under the walk
/// sends the kernel back to the first key, so a walk during churn may
/// count some twice, never forever.
#[must_use]
pub fn walk_keys(map: &aya::maps::MapData) -> usize {
    let capacity = map.info().map_or(limiter_common::maps::MAX_BUCKET_CAPACITY, |i| i.max_entries());
    let mut key = [0u8; size_of::<limiter_common::BucketKey>()];
    let mut next = key;
    let mut n = 0;
    while n < capacity as usize {
        let at = if n == 0 { std::ptr::null() } else { key.as_ptr() };
        if rawmap::elem_raw(map, rawmap::Cmd::NextKey, at, next.as_mut_ptr()).is_err() {
            break;
        }
        (key, n) = (next, n + 1);
    }
    n
}

/// The address of a bucket key's prefix (`None`: not an IP family).
#[must_use]
pub fn key_addr(k: &limiter_common::BucketKey) -> Option<std::net::IpAddr> {
    let [a, b] = k.addr.map(u32::to_ne_bytes);
    match k.family {
        limiter_common::family::IPV4 => Some(std::net::IpAddr::from(a)),
        limiter_common::family::IPV6 => {
            let mut o = [0u8; 16];
            o[..4].copy_from_slice(&a);
            o[4..8].copy_from_slice(&b);
            Some(std::net::IpAddr::from(o))
        }
        _ => None,
    }
}

/// The network a bucket key stands for (`::/0`-based for a key of no
/// family, a host network for a length its family cannot have).
#[must_use]
pub fn net(k: &limiter_common::BucketKey) -> ipnet::IpNet {
    let addr = key_addr(k).unwrap_or(std::net::IpAddr::from([0u8; 16]));
    ipnet::IpNet::new(addr, k.prefix_len).unwrap_or_else(|_| ipnet::IpNet::from(addr))
}

/// A bucket key as a CIDR string (the fleet store's keys spell it so).
#[must_use]
pub fn cidr(k: &limiter_common::BucketKey) -> String {
    net(k).to_string()
}

/// Index of `iface` in the calling thread's network namespace.
pub fn ifindex(iface: &str) -> Result<u32, LoadError> {
    let c = std::ffi::CString::new(iface).map_err(|_| LoadError::NoInterface { iface: iface.into() })?;
    // SAFETY: valid NUL-terminated name.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(LoadError::NoInterface { iface: iface.into() }),
        i => Ok(i),
    }
}
