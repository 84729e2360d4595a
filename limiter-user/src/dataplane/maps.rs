//! Typed handles on every map userspace reads or writes, taken out of the
//! loaded object once (a missing or mistyped map fails the load with its
//! name), and the operations on them.

use std::time::Instant;

use aya::{
    Ebpf, Pod,
    maps::{
        Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues, RingBuf,
        lpm_trie::{Key, LpmTrie},
    },
};
use limiter_common::{
    BucketKey, BucketState, ClassCounters, ClassLimits, Config, Counter, MAX_CLASSES, Meta, RuntimeKey,
    RuntimeOverride, STAT_ENTRIES, cookie::SynGuard, deny::active, flags, maps, maps::MAX_OVERRIDES, stat_slot,
    window::WindowState,
};

use super::{
    LoadError,
    counters::Totals,
    deny::{Active, DenyMaps, DenyWrites, Pinned, SETTLE},
};
use crate::policy::Compiled;

pub(crate) use super::error::Named;

fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError> {
    T::try_from(ebpf.take_map(name).ok_or(LoadError::MissingMap(name))?).on(name)
}

/// Sum of one per-CPU slot over every CPU: the one way counters are added.
pub(crate) fn sum_cpus<T: Pod + Default + std::ops::AddAssign>(values: &PerCpuValues<T>) -> T {
    values.iter().fold(T::default(), |mut acc, v| {
        acc += *v;
        acc
    })
}

/// The maps, typed: the policy tables the daemon writes, and the counters
/// it reads.
pub struct Maps {
    /// `None` while the daemon has them away on a policy change.
    pub(crate) tables: Option<Tables>,
    pub counters: Counters,
    /// `None` once the fleet sync has taken them.
    pub windows: Option<Box<WindowMaps>>,
    /// `None` once the tunnels' feature has taken them.
    pub tunnel: Option<Box<crate::tunnel::maps::TunnelMaps>>,
}

/// The window quotas' maps: the program's slice counts, the other nodes'
/// counts the fleet sync writes, and the program's touch events.
pub struct WindowMaps {
    pub windows: HashMap<MapData, BucketKey, WindowState>,
    pub fleet: HashMap<MapData, BucketKey, WindowState>,
    pub touched: RingBuf<MapData>,
    /// `[0]` sync epoch, `[1]` split divisor while the store is down.
    pub state: Array<MapData, u64>,
}

/// What a policy is written to: both `CONFIG` slots, `ACTIVE`, the
/// override tries and limits, the runtime record, `META`, `TEST_CLOCK`.
pub struct Tables {
    config: Array<MapData, Config>,
    active: Array<MapData, u32>,
    ovr4: [LpmTrie<MapData, u32, u32>; 2],
    ovr6: [LpmTrie<MapData, [u32; 4], u32>; 2],
    ovr_limits: Array<MapData, ClassLimits>,
    meta: Array<MapData, Meta>,
    runtime: HashMap<MapData, RuntimeKey, RuntimeOverride>,
    test_clock: Array<MapData, u64>,
    pub(crate) deny: DenyMaps,
    pub(crate) groups: super::groups::GroupMaps,
    last_flip: Option<Instant>,
}

/// What the program counts: per reason, per class, and its buckets.
pub struct Counters {
    stats: PerCpuArray<MapData, Counter>,
    pub(crate) buckets: HashMap<MapData, BucketKey, BucketState>,
    /// Capacity and kernel id of `BUCKETS` (a re-adopted map keeps the
    /// capacity it was created with).
    pub(crate) bucket_capacity: u32,
    pub(crate) buckets_id: u32,
    syn_guard: Array<MapData, SynGuard>,
    tcp_guard: Array<MapData, SynGuard>,
    deny_hits: PerCpuArray<MapData, u64>,
    group_hits: PerCpuArray<MapData, limiter_common::groups::GroupHits>,
}

impl Maps {
    /// Take every map out of a loaded object.
    pub(crate) fn take(ebpf: &mut Ebpf) -> Result<Self, LoadError> {
        let info = match ebpf.map(maps::BUCKETS) {
            Some(Map::LruHashMap(md)) => md.info().on(maps::BUCKETS)?,
            _ => return Err(LoadError::MissingMap(maps::BUCKETS)),
        };
        let tables = Tables {
            config: take(ebpf, maps::CONFIG)?,
            active: take(ebpf, maps::ACTIVE)?,
            ovr4: [take(ebpf, maps::OVR4[0])?, take(ebpf, maps::OVR4[1])?],
            ovr6: [take(ebpf, maps::OVR6[0])?, take(ebpf, maps::OVR6[1])?],
            ovr_limits: take(ebpf, maps::OVR_LIMITS)?,
            meta: take(ebpf, maps::META)?,
            runtime: take(ebpf, maps::RUNTIME)?,
            test_clock: take(ebpf, maps::TEST_CLOCK)?,
            deny: DenyMaps {
                deny: take(ebpf, maps::DENY)?,
                lens: take(ebpf, maps::DENY_LENS)?,
                origins: take(ebpf, maps::DENY_ORIGINS)?,
            },
            groups: super::groups::GroupMaps::take(ebpf)?,
            last_flip: None,
        };
        let counters = Counters {
            stats: take(ebpf, maps::STATS)?,
            buckets: take(ebpf, maps::BUCKETS)?,
            bucket_capacity: info.max_entries(),
            buckets_id: info.id(),
            syn_guard: take(ebpf, maps::SYN_GUARD)?,
            tcp_guard: take(ebpf, maps::TCP_GUARD)?,
            deny_hits: take(ebpf, maps::DENY_HITS)?,
            group_hits: take(ebpf, maps::GROUP_HITS)?,
        };
        let windows = WindowMaps {
            windows: take(ebpf, maps::WINDOWS)?,
            fleet: take(ebpf, maps::FLEET)?,
            touched: take(ebpf, maps::TOUCHED)?,
            state: take(ebpf, maps::FLEET_STATE)?,
        };
        let tunnel = crate::tunnel::maps::TunnelMaps::take(ebpf)?;
        Ok(Self { tables: Some(tables), counters, windows: Some(Box::new(windows)), tunnel: Some(Box::new(tunnel)) })
    }

    /// The policy tables. Panics if they were taken away.
    pub fn tables(&mut self) -> &mut Tables {
        self.tables.as_mut().expect("the policy tables are taken (a daemon owns them)")
    }

    /// Take the policy tables away (the daemon moves them to a worker
    /// thread for each policy change).
    pub fn take_tables(&mut self) -> Option<Tables> {
        self.tables.take()
    }

    /// See [`Tables::apply`].
    pub fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        self.tables().apply(c)
    }

    /// See [`Counters::totals`].
    pub fn totals(&self) -> Result<Totals, LoadError> {
        self.counters.totals()
    }

    /// See [`Counters::class_totals`].
    pub fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError> {
        self.counters.class_totals()
    }
}

impl Tables {
    pub(crate) fn meta(&self) -> Result<Meta, LoadError> {
        self.meta.get(&0, 0).on(maps::META)
    }

    pub(crate) fn set_meta(&mut self, m: &Meta) -> Result<(), LoadError> {
        self.meta.set(0, m, 0).on(maps::META)
    }

    /// Switch the data plane to `c` atomically: fill the idle slot's
    /// override tries and limits and its `CONFIG` entry, then flip
    /// `ACTIVE` (one 4-byte store). A packet reads `ACTIVE` and then its
    /// slot within well under a microsecond, so the slot it may still be
    /// reading is only rewritten after a settle time.
    pub fn apply(&mut self, c: &Compiled) -> Result<(), LoadError> {
        if let Some(t) = self.last_flip {
            std::thread::sleep(SETTLE.saturating_sub(t.elapsed()));
        }
        let next = 1 - self.active_slot()?;
        let slot = next as usize;
        let (name4, name6) = (maps::OVR4[slot], maps::OVR6[slot]);
        let t4 = &mut self.ovr4[slot];
        let old: Vec<Key<u32>> = t4.keys().filter_map(Result::ok).collect();
        for k in &old {
            t4.remove(k).on(name4)?;
        }
        for &(plen, addr, code) in &c.overrides.v4 {
            t4.insert(&Key::new(plen, addr), code, 0).on(name4)?;
        }
        let t6 = &mut self.ovr6[slot];
        let old: Vec<Key<[u32; 4]>> = t6.keys().filter_map(Result::ok).collect();
        for k in &old {
            t6.remove(k).on(name6)?;
        }
        for &(plen, addr, code) in &c.overrides.v6 {
            t6.insert(&Key::new(plen, addr), code, 0).on(name6)?;
        }
        for (i, l) in (0u32..).zip(&c.overrides.limits) {
            self.ovr_limits.set(next * MAX_OVERRIDES + i, l, 0).on(maps::OVR_LIMITS)?;
        }
        self.groups.set_limits(next, &c.groups)?;
        // How many leases of one bucket may be out at once: one per CPU
        // that can run the program (limiter_common::lease).
        let config = Config { cpus: possible_cpus(), ..c.config };
        self.config.set(next, config, 0).on(maps::CONFIG)?;
        // The deny set's bits of `ACTIVE` stay as they are.
        let word = self.active.get(&0, 0).on(maps::ACTIVE)?;
        self.active.set(0, (word & !active::CONFIG_SLOT) | next, 0).on(maps::ACTIVE)?;
        self.last_flip = Some(Instant::now());
        Ok(())
    }

    fn active_slot(&self) -> Result<u32, LoadError> {
        Ok(self.active.get(&0, 0).on(maps::ACTIVE)? & active::CONFIG_SLOT)
    }

    /// Write a change of the deny set (see [`DenyMaps::write`]).
    pub fn write_deny(&mut self, ch: &DenyWrites) -> Result<(), LoadError> {
        if ch.is_empty() {
            return Ok(());
        }
        let act = Active { map: &mut self.active, last_flip: &mut self.last_flip };
        self.deny.write(act, ch)
    }

    /// The deny set as pinned: its entries, its origins' names, and the
    /// lengths in force.
    pub fn deny_pinned(&self) -> Result<Pinned, LoadError> {
        let word = self.active.get(&0, 0).on(maps::ACTIVE)?;
        Ok(Pinned { entries: self.deny.entries()?, names: self.deny.origins()?, lens: self.deny.lens_in_force(word)? })
    }

    /// The kernel memory of `DENY` (its fdinfo's `memlock`), if known.
    #[must_use]
    pub fn deny_memory(&self) -> Option<u64> {
        super::rawmap::memlock(aya::maps::IterableMap::map(&self.deny.deny))
    }

    /// Write a change of the group tries, then move `ACTIVE`'s change
    /// count so that every bucket resolves again; the longest single
    /// write.
    pub fn write_groups(&mut self, w: &super::groups::GroupWrites) -> Result<std::time::Duration, LoadError> {
        if w.is_empty() {
            return Ok(std::time::Duration::ZERO);
        }
        let longest = self.groups.write(w)?;
        let word = self.active.get(&0, 0).on(maps::ACTIVE)?;
        self.active.set(0, super::groups::counted(word), 0).on(maps::ACTIVE)?;
        Ok(longest)
    }

    /// The kernel memory of the group tries, if known.
    #[must_use]
    pub fn groups_memory(&self) -> Option<u64> {
        self.groups.memory()
    }

    /// The group tries as pinned.
    pub fn groups_pinned(&self) -> Result<Vec<(ipnet::IpNet, u32)>, LoadError> {
        self.groups.entries()
    }

    /// Record the deny set's origins' names.
    pub fn set_deny_origins(&mut self, names: &[String]) -> Result<(), LoadError> {
        self.deny.set_origins(names)
    }

    /// The config the data plane enforces now, if any was applied.
    pub fn active_config(&self) -> Result<Option<Config>, LoadError> {
        let c = self.config.get(&self.active_slot()?, 0).on(maps::CONFIG)?;
        Ok((c.flags & flags::CONFIGURED != 0).then_some(c))
    }

    /// Every entry of the `RUNTIME` map (overrides set at run time).
    pub fn runtime_overrides(&self) -> Result<Vec<(RuntimeKey, RuntimeOverride)>, LoadError> {
        self.runtime.iter().map(|r| r.on(maps::RUNTIME)).collect()
    }

    /// Record (`Some`) or forget (`None`) one runtime override.
    pub fn set_runtime_override(&mut self, key: &RuntimeKey, value: Option<&RuntimeOverride>) -> Result<(), LoadError> {
        match value {
            Some(v) => self.runtime.insert(key, v, 0),
            None => match self.runtime.remove(key) {
                Err(MapError::KeyNotFound) => Ok(()),
                r => r,
            },
        }
        .on(maps::RUNTIME)
    }

    /// Set the injected clock read by the test entry point.
    pub fn set_test_clock(&mut self, now_ns: u64) -> Result<(), LoadError> {
        self.test_clock.set(0, now_ns, 0).on(maps::TEST_CLOCK)
    }
}

impl Counters {
    /// Every slot of `STATS`, summed over CPUs: one batch read of the
    /// whole map (a lookup per slot where the kernel refuses batches).
    fn stats(&self) -> Result<Vec<Counter>, LoadError> {
        let mut out = vec![Counter::default(); STAT_ENTRIES];
        let map = aya::maps::IterableMap::map(&self.stats);
        let read = super::rawmap::for_each_entry(map, |k, v| {
            let Some(slot) = k.first_chunk().and_then(|k| out.get_mut(u32::from_ne_bytes(*k) as usize)) else {
                return;
            };
            for cpu in v.chunks_exact(size_of::<Counter>()) {
                let word = |i: usize| u64::from_ne_bytes(cpu[i..i + 8].try_into().expect("8 bytes"));
                *slot += Counter { packets: word(0), bytes: word(8) };
            }
        });
        if read.is_err() {
            out.fill(Counter::default());
            for (i, slot) in (0u32..).zip(out.iter_mut()) {
                *slot = sum_cpus(&self.stats.get(&i, 0).on(maps::STATS)?);
            }
        }
        Ok(out)
    }

    /// Packets counted in one slot of `STATS` (see
    /// [`limiter_common::stat_index`]), summed over CPUs: one lookup.
    pub fn slot_packets(&self, index: u32) -> Result<u64, LoadError> {
        Ok(sum_cpus(&self.stats.get(&index, 0).on(maps::STATS)?).packets)
    }

    /// Counters per reason and family (all classes), summed over CPUs.
    pub fn totals(&self) -> Result<Totals, LoadError> {
        Ok(self.read()?.0)
    }

    /// [`Self::totals`] and [`Self::class_totals`] from one read, so that
    /// they agree.
    pub fn read(&self) -> Result<(Totals, [ClassCounters; MAX_CLASSES]), LoadError> {
        let (mut t, mut classes) = (Totals::default(), [ClassCounters::default(); MAX_CLASSES]);
        for (i, c) in self.stats()?.into_iter().enumerate() {
            let Some((class, reason, fam)) = stat_slot(i) else { continue };
            t.add(reason, fam, c);
            // Packets counted before they were classified are in no class.
            if let Some(slot) = classes.get_mut(class) {
                *slot.slot(reason.action()) += c;
            }
        }
        Ok((t, classes))
    }

    /// The bucket of `key`, if the program has one.
    #[must_use]
    pub fn bucket(&self, key: &BucketKey) -> Option<BucketState> {
        self.buckets.get(key, 0).ok()
    }

    /// Whether `class`'s `auto` SYN cookies are engaged at `now` (ns on
    /// the program's clock, `CLOCK_MONOTONIC_COARSE`).
    pub fn syn_cookies_engaged(&self, class: u32, now_ns: u64) -> Result<bool, LoadError> {
        let g = self.syn_guard.get(&class, 0).on(maps::SYN_GUARD)?;
        Ok(limiter_common::gcra::to_fixed(now_ns) < g.until)
    }

    /// Whether `class`'s `auto` out-of-state TCP check is engaged at `now`
    /// (ns on the program's clock, `CLOCK_MONOTONIC_COARSE`).
    pub fn tcp_state_engaged(&self, class: u32, now_ns: u64) -> Result<bool, LoadError> {
        let g = self.tcp_guard.get(&class, 0).on(maps::TCP_GUARD)?;
        Ok(limiter_common::gcra::to_fixed(now_ns) < g.until)
    }

    /// Release `class`'s `auto` out-of-state check, as if its hold had run
    /// out (for benches that measure it not engaged after a flood).
    pub fn release_tcp_state(&mut self, class: u32) -> Result<(), LoadError> {
        self.tcp_guard.set(class, SynGuard::default(), 0).on(maps::TCP_GUARD)
    }

    /// Packets the deny set dropped, by origin index, summed over CPUs.
    pub fn deny_hits(&self) -> Result<Vec<u64>, LoadError> {
        let mut out = Vec::with_capacity(super::deny::MAX_NAMED);
        for i in 0..super::deny::MAX_NAMED {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            out.push(sum_cpus(&self.deny_hits.get(&i, 0).on(maps::DENY_HITS)?));
        }
        Ok(out)
    }

    /// The packets the first `n` groups passed and dropped, by index,
    /// summed over CPUs.
    pub fn group_hits(&self, n: usize) -> Result<Vec<limiter_common::groups::GroupHits>, LoadError> {
        let n = u32::try_from(n).unwrap_or(u32::MAX).min(limiter_common::groups::MAX_GROUPS);
        (0..n).map(|i| Ok(sum_cpus(&self.group_hits.get(&i, 0).on(maps::GROUP_HITS)?))).collect()
    }

    /// Per-class counters by action (all families), summed over CPUs.
    /// Packets counted before they were classified are in no class.
    pub fn class_totals(&self) -> Result<[ClassCounters; MAX_CLASSES], LoadError> {
        Ok(self.read()?.1)
    }
}

/// Possible CPUs of this host (0, leases off, if that cannot be read).
fn possible_cpus() -> u32 {
    aya::util::nr_cpus().ok().and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

/// `CLOCK_MONOTONIC_COARSE` in ns: the clock of the production program.
#[must_use]
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
