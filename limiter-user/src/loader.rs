//! Loading the XDP object, attaching it, and reading and writing its maps.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, HashMap, MapData, PerCpuArray,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{ProgramError, TestRun, TestRunAttrs, TestRunOptions, Xdp, XdpMode, xdp::XdpLinkId},
};
use limiter_common::{
    BucketKey, BucketState, ClassCounters, ClassLimits, Config, Counter, MAX_CLASSES, META_MAGIC, Meta, Reason,
    RuntimeKey, RuntimeOverride, SCHEMA_VERSION, STAT_FAMILIES, maps, maps::MAX_OVERRIDES, programs, stat_index,
};

use crate::policy::CompiledOverrides;

use crate::stats::Totals;

/// What went wrong loading, attaching or touching the maps.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the XDP object")]
    Object(#[source] aya::EbpfError),
    #[error("program {0} missing from the object")]
    MissingProgram(&'static str),
    #[error("map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("loading program {name} into the kernel (verifier)")]
    Verify {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("interface {iface} does not exist")]
    NoInterface { iface: String },
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
        mode: &'static str,
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
    Pin(#[from] crate::pin::PinError),
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
    #[error("test run of {name}")]
    TestRun {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
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
    fn xdp(self) -> XdpMode {
        match self {
            Self::Native => XdpMode::Driver,
            Self::Generic => XdpMode::Skb,
        }
    }

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }
}

/// A loaded XDP object and its maps.
pub struct Limiter {
    ebpf: Ebpf,
    last_flip: Option<std::time::Instant>,
}

/// `AYA_LOG_LEVEL` for the program: its debug lines are compiled in but
/// stay off unless the daemon itself logs at debug level.
fn ebpf_log_level() -> u8 {
    let debug = tracing::level_filters::LevelFilter::current() >= tracing::level_filters::LevelFilter::DEBUG;
    if debug { aya_log::Level::Debug as u8 } else { aya_log::Level::Info as u8 }
}

fn map_err(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> LoadError {
    move |source| LoadError::Map { map, source }
}

impl Limiter {
    /// Load the object with a bucket map of `capacity` entries. Programs are
    /// verified lazily by [`Limiter::load_program`].
    pub fn open(capacity: u32) -> Result<Self, LoadError> {
        Self::load(capacity, None)
    }

    /// Load the object; with `pin_dir`, its maps are pinned there (and
    /// pinned maps already there are re-adopted as they are).
    fn load(capacity: u32, pin_dir: Option<&Path>) -> Result<Self, LoadError> {
        let level = ebpf_log_level();
        let paths: Vec<(&'static str, PathBuf)> = pin_dir
            .map(|dir| crate::pin::PINNED_MAPS.iter().map(|(n, ..)| (*n, dir.join(n))).collect())
            .unwrap_or_default();
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(maps::BUCKETS, capacity);
        loader.override_global(aya_log::LEVEL, &level, true);
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let ebpf = loader.load(crate::OBJECT).map_err(LoadError::Object)?;
        Ok(Self { ebpf, last_flip: None })
    }

    fn xdp(&mut self, name: &'static str) -> Result<&mut Xdp, LoadError> {
        self.ebpf.program_mut(name).and_then(|p| p.try_into().ok()).ok_or(LoadError::MissingProgram(name))
    }

    /// Load the object with its maps pinned in `dir`, re-adopting pinned
    /// maps (buckets, counters and config kept) after checking they match
    /// this build's schema. Returns the loader and whether maps were adopted.
    pub fn open_pinned(capacity: u32, dir: &Path) -> Result<(Self, bool), LoadError> {
        crate::pin::ensure_dir(dir)?;
        let adopted = crate::pin::check(dir)?.is_some();
        let mut l = Self::load(capacity, Some(dir))?;
        if !adopted {
            l.set_meta(&Meta { magic: META_MAGIC, schema: SCHEMA_VERSION, ifindex: 0, pad: 0 })?;
        }
        Ok((l, adopted))
    }

    fn meta(&self) -> Result<Meta, LoadError> {
        let a: Array<&MapData, Meta> = Array::try_from(self.map(maps::META)?).map_err(map_err(maps::META))?;
        a.get(&0, 0).map_err(map_err(maps::META))
    }

    fn set_meta(&mut self, m: &Meta) -> Result<(), LoadError> {
        let mut a: Array<&mut MapData, Meta> =
            Array::try_from(self.map_mut(maps::META)?).map_err(map_err(maps::META))?;
        a.set(0, m, 0).map_err(map_err(maps::META))
    }

    /// Capacity of the bucket map actually in use (a re-adopted map keeps
    /// the capacity it was created with).
    pub fn capacity(&self) -> Result<u32, LoadError> {
        match self.map(maps::BUCKETS)? {
            aya::maps::Map::LruHashMap(md) => Ok(md.info().map_err(map_err(maps::BUCKETS))?.max_entries()),
            _ => Err(LoadError::MissingMap(maps::BUCKETS)),
        }
    }

    /// Attach with the link and program pinned in `dir`. If a link is
    /// pinned already, this build's program replaces the old one on it
    /// atomically (`bpf_link_update`): no moment without enforcement.
    /// Returns `true` when an existing link was re-adopted.
    pub fn attach_pinned(&mut self, iface: &str, mode: AttachMode, dir: &Path) -> Result<bool, LoadError> {
        use aya::programs::links::{FdLink, PinnedLink};

        let ifindex = ifindex(iface)?;
        let mut meta = self.meta()?;
        let link_path = dir.join(crate::pin::LINK);
        if meta.ifindex != 0 && meta.ifindex != ifindex && link_path.exists() {
            return Err(LoadError::OtherInterface {
                dir: dir.display().to_string(),
                pinned: meta.ifindex,
                iface: iface.into(),
            });
        }
        self.load_program(programs::LIMITER)?;
        let replaced = if link_path.exists() {
            let pinned = PinnedLink::from_pin(&link_path).map_err(LoadError::Adopt)?;
            let link = aya::programs::xdp::XdpLink::try_from(FdLink::from(pinned)).map_err(LoadError::Adopt)?;
            self.xdp(programs::LIMITER)?.attach_to_link(link).map_err(LoadError::Replace)?;
            true
        } else {
            let id = self.attach(iface, mode)?;
            let prog = self.xdp(programs::LIMITER)?;
            let link = prog.take_link(id).map_err(|source| LoadError::Attach {
                iface: iface.into(),
                mode: mode.label(),
                source,
            })?;
            let fd_link = FdLink::try_from(link).map_err(LoadError::Adopt)?;
            fd_link.pin(&link_path).map_err(|source| LoadError::PinObject { what: "link", source })?;
            false
        };
        let prog_path = dir.join(crate::pin::PROG);
        let _ = std::fs::remove_file(&prog_path);
        self.xdp(programs::LIMITER)?
            .pin(&prog_path)
            .map_err(|source| LoadError::PinObject { what: "program", source })?;
        meta.ifindex = ifindex;
        self.set_meta(&meta)?;
        Ok(replaced)
    }

    /// Run the verifier on one entry point (idempotent).
    pub fn load_program(&mut self, name: &'static str) -> Result<(), LoadError> {
        let prog = self.xdp(name)?;
        if prog.fd().is_ok() {
            return Ok(());
        }
        prog.load().map_err(|source| LoadError::Verify { name, source })
    }

    /// Instructions the verifier processed for a loaded entry point.
    pub fn verified_instructions(&mut self, name: &'static str) -> Result<Option<u32>, LoadError> {
        let info = self.xdp(name)?.info().map_err(|source| LoadError::Verify { name, source })?;
        Ok(info.verified_instruction_count())
    }

    /// Attach the production entry point. The link lives as long as `self`.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<XdpLinkId, LoadError> {
        self.attach_program(programs::LIMITER, iface, mode)
    }

    /// Attach any entry point (the bench's receivers too). The link lives
    /// as long as `self`.
    pub fn attach_program(
        &mut self,
        name: &'static str,
        iface: &str,
        mode: AttachMode,
    ) -> Result<XdpLinkId, LoadError> {
        self.load_program(name)?;
        let prog = self.xdp(name)?;
        prog.attach(iface, mode.xdp()).map_err(|source| match source {
            ProgramError::UnknownInterface { .. } => LoadError::NoInterface { iface: iface.into() },
            source if mode == AttachMode::Native => LoadError::NativeUnsupported { iface: iface.into(), source },
            source => LoadError::Attach { iface: iface.into(), mode: mode.label(), source },
        })
    }

    /// Detach a link made by [`Limiter::attach`].
    pub fn detach(&mut self, link: XdpLinkId) -> Result<(), LoadError> {
        self.xdp(programs::LIMITER)?.detach(link).map_err(|source| LoadError::Attach {
            iface: String::new(),
            mode: "detach",
            source,
        })
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, LoadError> {
        self.ebpf.map_mut(name).ok_or(LoadError::MissingMap(name))
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, LoadError> {
        self.ebpf.map(name).ok_or(LoadError::MissingMap(name))
    }

    /// Switch the data plane to `cfg` with no overrides (see [`Limiter::apply`]).
    pub fn apply_config(&mut self, cfg: &Config) -> Result<(), LoadError> {
        self.apply(cfg, &CompiledOverrides::default())
    }

    /// Switch the data plane to `cfg` and `ovr` atomically: fill the idle
    /// slot's override tries and limits and its `CONFIG` entry, then flip
    /// `ACTIVE` (one 4-byte store). A packet reads `ACTIVE` and then its
    /// slot within well under a microsecond, so the slot it may still be
    /// reading is only rewritten after a settle time.
    pub fn apply(&mut self, cfg: &Config, ovr: &CompiledOverrides) -> Result<(), LoadError> {
        const SETTLE: Duration = Duration::from_millis(2);
        if let Some(t) = self.last_flip {
            std::thread::sleep(SETTLE.saturating_sub(t.elapsed()));
        }
        let next = 1 - self.active_slot()?;
        let slot = next as usize;
        {
            let mut t4: LpmTrie<&mut MapData, u32, u32> =
                LpmTrie::try_from(self.map_mut(maps::OVR4[slot])?).map_err(map_err(maps::OVR4[slot]))?;
            let old: Vec<Key<u32>> = t4.keys().filter_map(Result::ok).collect();
            for k in &old {
                t4.remove(k).map_err(map_err(maps::OVR4[slot]))?;
            }
            for &(plen, addr, code) in &ovr.v4 {
                t4.insert(&Key::new(plen, addr), code, 0).map_err(map_err(maps::OVR4[slot]))?;
            }
        }
        {
            let mut t6: LpmTrie<&mut MapData, [u32; 4], u32> =
                LpmTrie::try_from(self.map_mut(maps::OVR6[slot])?).map_err(map_err(maps::OVR6[slot]))?;
            let old: Vec<Key<[u32; 4]>> = t6.keys().filter_map(Result::ok).collect();
            for k in &old {
                t6.remove(k).map_err(map_err(maps::OVR6[slot]))?;
            }
            for &(plen, addr, code) in &ovr.v6 {
                t6.insert(&Key::new(plen, addr), code, 0).map_err(map_err(maps::OVR6[slot]))?;
            }
        }
        {
            let mut lim: Array<&mut MapData, ClassLimits> =
                Array::try_from(self.map_mut(maps::OVR_LIMITS)?).map_err(map_err(maps::OVR_LIMITS))?;
            for (i, l) in (0u32..).zip(&ovr.limits) {
                lim.set(next * MAX_OVERRIDES + i, l, 0).map_err(map_err(maps::OVR_LIMITS))?;
            }
        }
        let mut a: Array<&mut MapData, Config> =
            Array::try_from(self.map_mut(maps::CONFIG)?).map_err(map_err(maps::CONFIG))?;
        a.set(next, cfg, 0).map_err(map_err(maps::CONFIG))?;
        let mut flip: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::ACTIVE)?).map_err(map_err(maps::ACTIVE))?;
        flip.set(0, next, 0).map_err(map_err(maps::ACTIVE))?;
        self.last_flip = Some(std::time::Instant::now());
        Ok(())
    }

    fn active_slot(&self) -> Result<u32, LoadError> {
        let a: Array<&MapData, u32> = Array::try_from(self.map(maps::ACTIVE)?).map_err(map_err(maps::ACTIVE))?;
        Ok(a.get(&0, 0).map_err(map_err(maps::ACTIVE))? & 1)
    }

    /// The config the data plane enforces now, if any was applied.
    pub fn active_config(&self) -> Result<Option<Config>, LoadError> {
        let slot = self.active_slot()?;
        let a: Array<&MapData, Config> = Array::try_from(self.map(maps::CONFIG)?).map_err(map_err(maps::CONFIG))?;
        let c = a.get(&slot, 0).map_err(map_err(maps::CONFIG))?;
        Ok((c.flags & limiter_common::flags::CONFIGURED != 0).then_some(c))
    }

    /// Per-class counters summed over CPUs.
    pub fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError> {
        let a: PerCpuArray<&MapData, ClassCounters> =
            PerCpuArray::try_from(self.map(maps::CLASS_STATS)?).map_err(map_err(maps::CLASS_STATS))?;
        let mut out = [ClassCounters::default(); MAX_CLASSES];
        for (i, slot) in (0u32..).zip(out.iter_mut()) {
            for c in a.get(&i, 0).map_err(map_err(maps::CLASS_STATS))?.iter() {
                for (o, n) in
                    [(&mut slot.admitted, c.admitted), (&mut slot.dropped, c.dropped), (&mut slot.shadow, c.shadow)]
                {
                    o.packets += n.packets;
                    o.bytes += n.bytes;
                }
            }
        }
        Ok(out)
    }

    /// Set the injected clock read by the test entry point.
    pub fn set_test_clock(&mut self, now_ns: u64) -> Result<(), LoadError> {
        let mut a: Array<&mut MapData, u64> =
            Array::try_from(self.map_mut(maps::TEST_CLOCK)?).map_err(map_err(maps::TEST_CLOCK))?;
        a.set(0, now_ns, 0).map_err(map_err(maps::TEST_CLOCK))
    }

    /// Counters summed over CPUs.
    pub fn totals(&self) -> Result<Totals, LoadError> {
        let a: PerCpuArray<&MapData, Counter> =
            PerCpuArray::try_from(self.map(maps::STATS)?).map_err(map_err(maps::STATS))?;
        let mut t = Totals::default();
        for (r, reason) in Reason::ALL.iter().enumerate() {
            for fam in 0..STAT_FAMILIES {
                let idx = stat_index(*reason, u32::try_from(fam).expect("small"));
                for c in a.get(&idx, 0).map_err(map_err(maps::STATS))?.iter() {
                    for slot in [&mut t.by_reason[r], &mut t.by_family[r][fam]] {
                        slot.packets += c.packets;
                        slot.bytes += c.bytes;
                    }
                }
            }
        }
        Ok(t)
    }

    fn buckets(&self) -> Result<HashMap<&MapData, BucketKey, BucketState>, LoadError> {
        HashMap::try_from(self.map(maps::BUCKETS)?).map_err(map_err(maps::BUCKETS))
    }

    /// The eBPF log forwarder (aya-log into `log`, which `tracing` picks
    /// up), taken out of the loader (once). `None` if it cannot start.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.ebpf).ok()
    }

    /// The sampled-drop ring buffer, taken out of the loader (once).
    pub fn take_drop_events(&mut self) -> Option<aya::maps::RingBuf<MapData>> {
        self.ebpf.take_map(maps::DROP_EVENTS).and_then(|m| aya::maps::RingBuf::try_from(m).ok())
    }

    /// Kernel id of the bucket map (for a second, independent handle).
    pub fn buckets_map_id(&self) -> Result<u32, LoadError> {
        match self.map(maps::BUCKETS)? {
            aya::maps::Map::LruHashMap(md) => Ok(md.info().map_err(map_err(maps::BUCKETS))?.id()),
            _ => Err(LoadError::MissingMap(maps::BUCKETS)),
        }
    }

    /// Number of tracked prefixes (walks the map's keys).
    pub fn tracked(&self) -> Result<usize, LoadError> {
        Ok(self.buckets()?.keys().flatten().count())
    }

    /// One bucket's state, if tracked.
    pub fn bucket(&self, key: &BucketKey) -> Result<Option<BucketState>, LoadError> {
        match self.buckets()?.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(maps::BUCKETS)(e)),
        }
    }

    /// Every entry of the `RUNTIME` map (overrides set at run time).
    pub fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        let m: HashMap<&MapData, RuntimeKey, RuntimeOverride> =
            HashMap::try_from(self.map(maps::RUNTIME)?).map_err(map_err(maps::RUNTIME))?;
        m.iter().map(|r| r.map_err(map_err(maps::RUNTIME))).collect()
    }

    /// Record (`Some`) or forget (`None`) one runtime override.
    pub fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        let mut m: HashMap<&mut MapData, RuntimeKey, RuntimeOverride> =
            HashMap::try_from(self.map_mut(maps::RUNTIME)?).map_err(map_err(maps::RUNTIME))?;
        match value {
            Some(v) => m.insert(key, v, 0),
            None => match m.remove(key) {
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                r => r,
            },
        }
        .map_err(map_err(maps::RUNTIME))
    }

    /// BPF_PROG_TEST_RUN of one entry point over `data`, `repeat` times.
    /// Returns the XDP action and the kernel's mean duration per run.
    pub fn test_run(&mut self, name: &'static str, data: &[u8], repeat: u32) -> Result<(u32, Duration), LoadError> {
        self.run_with(name, TestRunOptions { data_in: Some(data), repeat, ..TestRunOptions::new() })
    }

    /// BPF_PROG_TEST_RUN in live-frames mode: the entry point runs `repeat`
    /// times over copies of `frame` as if it had arrived on `iface` (in the
    /// calling thread's network namespace), and frames it returns `XDP_TX`
    /// for are really sent out of that interface. Returns the kernel's mean
    /// duration per run.
    pub fn test_run_live(
        &mut self,
        name: &'static str,
        frame: &[u8],
        iface: &str,
        repeat: u32,
    ) -> Result<Duration, LoadError> {
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
        // rx_queue_index, egress_ifindex.
        let ctx: Vec<u8> = [0, len, 0, ifindex(iface)?, 0, 0].iter().flat_map(|w: &u32| w.to_ne_bytes()).collect();
        let attrs = TestRunAttrs::new().xdp_live_frames(64);
        let opts = TestRunOptions { data_in: Some(frame), ctx_in: Some(&ctx), repeat, attrs, ..TestRunOptions::new() };
        Ok(self.run_with(name, opts)?.1)
    }

    fn run_with(&mut self, name: &'static str, opts: TestRunOptions<'_>) -> Result<(u32, Duration), LoadError> {
        self.load_program(name)?;
        let r = self.xdp(name)?.test_run(opts).map_err(|source| LoadError::TestRun { name, source })?;
        Ok((r.return_value, r.duration))
    }
}

/// Index of `iface` in the calling thread's network namespace.
fn ifindex(iface: &str) -> Result<u32, LoadError> {
    let c = std::ffi::CString::new(iface).map_err(|_| LoadError::NoInterface { iface: iface.into() })?;
    // SAFETY: valid NUL-terminated name.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(LoadError::NoInterface { iface: iface.into() }),
        i => Ok(i),
    }
}
