//! Test and bench helpers (the `testing` feature): the bench object, which
//! holds the production programs and the bench's own; BPF_PROG_TEST_RUN
//! of any entry point, also in live-frames mode; attaching any entry
//! point; reading one bucket. Not part of the production API.

use std::time::Duration;

use aya::programs::{TestRun as _, TestRunAttrs, TestRunOptions, xdp::XdpLinkId};
use limiter_common::{BucketKey, BucketState, Config, maps as names, window::WindowState};

use super::{AttachMode, DataPlane, LoadError, error::Named as _, ifindex};
use crate::policy::{Compiled, CompiledOverrides};

/// The bench object: limiter-ebpf built with its `bench` feature.
pub static BENCH_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-bench.bpf.o"));

impl DataPlane {
    /// Load the bench object (production programs plus the bench's).
    pub fn open_bench(capacity: u32) -> Result<Self, LoadError> {
        Self::load(BENCH_OBJECT, capacity, None, &[])
    }

    /// Switch to `cfg` with no overrides.
    pub fn apply_config(&mut self, cfg: &Config) -> Result<(), LoadError> {
        self.maps.apply(&Compiled { config: *cfg, overrides: CompiledOverrides::default(), groups: Vec::new() })
    }

    /// Attach any entry point (the bench's receivers too).
    pub fn attach_entry(&mut self, name: &'static str, iface: &str, mode: AttachMode) -> Result<XdpLinkId, LoadError> {
        self.attach_program(name, iface, mode)
    }

    /// Instructions the verifier processed for a loaded entry point.
    pub fn verified_instructions(&mut self, name: &'static str) -> Result<Option<u32>, LoadError> {
        let info = self.xdp(name)?.info().map_err(|source| LoadError::Verify { name, source })?;
        Ok(info.verified_instruction_count())
    }

    /// Write one tunnelled service (every port entry in `keys`), its
    /// backends by index, and its Maglev table, as the daemon's feature
    /// would (the tests and benches of the tunnel's data plane).
    pub fn set_tunnel(
        &mut self,
        keys: &[limiter_common::tunnel::ServiceKey],
        service: limiter_common::tunnel::Service,
        backends: &[(u32, limiter_common::tunnel::Backend)],
        table: &[u32],
    ) -> anyhow::Result<()> {
        let maps = self.maps.tunnel.as_mut().ok_or_else(|| anyhow::anyhow!("the tunnel maps are taken"))?;
        for k in keys {
            maps.services.insert(*k, service, 0)?;
        }
        for (i, b) in backends {
            maps.backends.set(*i, *b, 0)?;
            maps.forget_hop(*i)?;
        }
        maps.write_table(service.index, table, None)
    }

    /// Packets and bytes forwarded to backend `index`, and each outcome's
    /// packets, over every CPU.
    #[must_use]
    pub fn tunnel_counts(&self, index: u32) -> (limiter_common::Counter, Vec<u64>) {
        self.maps.tunnel.as_ref().map(|m| (m.hits(index), m.outcomes())).unwrap_or_default()
    }

    /// Set the injected clock read by the test entry point.
    pub fn set_test_clock(&mut self, now_ns: u64) -> Result<(), LoadError> {
        self.maps.tables().set_test_clock(now_ns)
    }

    /// BPF_PROG_TEST_RUN of one entry point over `data`, `repeat` times.
    /// Returns the XDP action and the kernel's mean duration per run.
    pub fn test_run(&mut self, name: &'static str, data: &[u8], repeat: u32) -> Result<(u32, Duration), LoadError> {
        self.run_with(name, TestRunOptions { data_in: Some(data), repeat, ..TestRunOptions::new() })
    }

    /// BPF_PROG_TEST_RUN of the test-clock entry point at `now_ns` over
    /// `data`, once; returns the XDP action and the frame as the program
    /// left it (what `XDP_TX` would send).
    pub fn run_out(&mut self, now_ns: u64, data: &[u8]) -> Result<(u32, Vec<u8>), LoadError> {
        self.set_test_clock(now_ns)?;
        let mut out = vec![0u8; data.len() + 256];
        let opts = TestRunOptions { data_in: Some(data), data_out: Some(&mut out), repeat: 1, ..TestRunOptions::new() };
        let name = limiter_common::programs::LIMITER_TEST_CLOCK;
        self.load_program(name)?;
        let r = self.xdp(name)?.test_run(opts).map_err(|source| LoadError::TestRun { name, source })?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, out))
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

    /// Number of tracked prefixes, as the daemon counts them (in batches;
    /// panics where the kernel refuses them, which the daemon would walk).
    #[must_use]
    pub fn tracked(&self) -> usize {
        super::rawmap::count_entries(self.buckets_map()).expect("BPF_MAP_LOOKUP_BATCH on the bucket map")
    }

    /// Number of tracked prefixes, by walking the bucket map's keys.
    #[must_use]
    pub fn tracked_by_walk(&self) -> usize {
        super::walk_keys(self.buckets_map())
    }

    fn buckets_map(&self) -> &aya::maps::MapData {
        use aya::maps::IterableMap as _;
        self.maps.counters.buckets.map()
    }

    /// One prefix's window slice counts, if tracked.
    pub fn window(&self, key: &BucketKey) -> Result<Option<WindowState>, LoadError> {
        let Some(w) = &self.maps.windows else { return Ok(None) };
        match w.windows.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).on(names::WINDOWS),
        }
    }

    /// Write the other nodes' counts of a prefix, as the fleet sync does.
    pub fn set_fleet(&mut self, key: &BucketKey, others: WindowState) -> Result<(), LoadError> {
        let Some(w) = &mut self.maps.windows else { return Ok(()) };
        w.fleet.insert(key, others, 0).on(names::FLEET)
    }

    /// BPF_PROG_TEST_RUN of `name` over `data`, `repeat` times on each CPU
    /// of `cpus` at the same moment (a thread pinned to each), to race the
    /// program against itself on shared map entries. The kernel's mean time
    /// per run on each CPU.
    pub fn test_run_on_cpus(
        &mut self,
        name: &'static str,
        data: &[u8],
        repeat: u32,
        cpus: &[usize],
    ) -> Result<Vec<Duration>, LoadError> {
        self.load_program(name)?;
        let prog: &aya::programs::Xdp = self.xdp(name)?;
        let start = std::sync::Barrier::new(cpus.len());
        std::thread::scope(|s| {
            let runs: Vec<_> = cpus
                .iter()
                .map(|&cpu| {
                    let start = &start;
                    s.spawn(move || {
                        // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
                        unsafe {
                            let mut set: libc::cpu_set_t = std::mem::zeroed();
                            libc::CPU_SET(cpu, &mut set);
                            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
                        }
                        start.wait();
                        prog.test_run(TestRunOptions { data_in: Some(data), repeat, ..TestRunOptions::new() })
                    })
                })
                .collect();
            runs.into_iter()
                .map(|r| {
                    let r = r.join().expect("test-run thread").map_err(|source| LoadError::TestRun { name, source })?;
                    Ok(r.duration)
                })
                .collect()
        })
    }

    /// One bucket's state, if tracked.
    pub fn bucket(&self, key: &BucketKey) -> Result<Option<BucketState>, LoadError> {
        match self.maps.counters.buckets.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).on(names::BUCKETS),
        }
    }
}
