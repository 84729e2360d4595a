//! The real XDP object, loaded for BPF_PROG_TEST_RUN.

pub use limiter::dataplane::xdp_action::{XDP_DROP, XDP_PASS};
use limiter::{
    dataplane::{DataPlane, Totals},
    policy::{Class, Compiled, CostUnit, Limit, Mode, Policy, Protocol, Scope, StoreFailure, SynCookies, Window},
};
use limiter_common::{BucketKey, Reason, cost, family, programs};

/// Panic with a clear message unless running as root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(euid == 0, "kernel tests load BPF programs and need root: run `cargo xtask test` as root");
}

/// A private copy of the production object (its own maps, 1,024 buckets)
/// with the test-clock entry point verified and `c` applied.
#[must_use]
pub fn open(c: &Compiled) -> DataPlane {
    open_with_capacity(c, 1024)
}

/// [`open`] with room for `capacity` buckets.
#[must_use]
pub fn open_with_capacity(c: &Compiled, capacity: u32) -> DataPlane {
    require_root();
    ready(DataPlane::open(capacity).expect("load the XDP object"), c)
}

/// [`open`] of the object built without SYN cookies (for kernels
/// without their helpers).
#[must_use]
pub fn open_without_syn_cookies(c: &Compiled) -> DataPlane {
    require_root();
    let plan = limiter::dataplane::kernel::Plan {
        program: limiter::dataplane::kernel::Program::WithoutSynCookies,
        ..limiter::dataplane::kernel::Plan::default()
    };
    ready(DataPlane::open_program(1024, plan).expect("load the object without SYN cookies"), c)
}

/// [`open_with_capacity`] of the bench object (the production programs
/// and the bench's own).
#[must_use]
pub fn open_bench(c: &Compiled, capacity: u32) -> DataPlane {
    require_root();
    ready(DataPlane::open_bench(capacity).expect("load the bench object"), c)
}

fn ready(mut l: DataPlane, c: &Compiled) -> DataPlane {
    l.maps.apply(c).expect("write CONFIG");
    l.load_program(programs::LIMITER_TEST_CLOCK).expect("verify limiter_test_clock");
    l
}

/// A policy whose UDP packets fall in a window-quota class of `limit`
/// packets per `length_ms` in `slices` slices (of `scope`), compiled the
/// way the daemon compiles it.
#[must_use]
pub fn window_config(limit: u64, length_ms: u64, slices: u32, scope: Scope) -> Compiled {
    let window = Window {
        limit,
        length: std::time::Duration::from_millis(length_ms),
        slices,
        scope,
        on_store_failure: StoreFailure::Open,
    };
    let policy = Policy {
        classes: vec![Class {
            name: "quota".into(),
            protocol: Protocol::Udp,
            ports: Vec::new(),
            source_ports: Vec::new(),
            syn: false,
            limit: Limit { rate: 0, burst: 0, cost: CostUnit::Packets, mode: Mode::Enforce, window: Some(window) },
            syn_cookies: SynCookies::Off,
            syn_rate: None,
            tcp_state: None,
            criticality: limiter::policy::Criticality::Default,
        }],
        capacity: 1024,
        ..Policy::default()
    };
    let c = policy.compile(1).expect("valid test policy");
    assert_eq!(c.config.classes[1].slices, slices);
    c
}

/// A policy from limits, compiled the way the daemon compiles it.
#[must_use]
pub fn config(rate: u64, burst: u64, bytes: bool, v4: u32, v6: u32) -> Compiled {
    let policy = Policy {
        default: Limit {
            rate,
            burst,
            cost: if bytes { CostUnit::Bytes } else { CostUnit::Packets },
            mode: Mode::Enforce,
            window: None,
        },
        v4_prefix: v4,
        v6_prefix: v6,
        capacity: 1024,
        ..Policy::default()
    };
    let c = policy.compile(1).expect("valid test policy");
    assert_eq!(c.config.classes[0].cost, if bytes { cost::BYTES } else { cost::PACKETS });
    c
}

/// Run one frame through the test-clock entry point at `now_ns`; return
/// the XDP action and the counter deltas it caused.
pub fn run_at(l: &mut DataPlane, now_ns: u64, frame: &[u8]) -> (u32, Totals) {
    l.set_test_clock(now_ns).expect("set TEST_CLOCK");
    let before = l.maps.totals().expect("read STATS");
    let (action, _) = l.test_run(programs::LIMITER_TEST_CLOCK, frame, 1).expect("BPF_PROG_TEST_RUN");
    (action, l.maps.totals().expect("read STATS").since(&before))
}

/// Assert the deltas are exactly one packet of `len` bytes under `reason`.
pub fn assert_counted_once(delta: &Totals, reason: Reason, len: usize, what: &str) {
    for r in Reason::ALL {
        let c = delta.get(r);
        if r == reason {
            assert_eq!((c.packets, c.bytes), (1, len as u64), "{what}: counter {}", r.label());
        } else {
            assert_eq!((c.packets, c.bytes), (0, 0), "{what}: unexpected count under {}", r.label());
        }
    }
}

/// Run one frame at `now`; return the one reason its counters moved under.
pub fn reason_at(l: &mut DataPlane, now_ns: u64, frame: &[u8]) -> Reason {
    let (_, delta) = run_at(l, now_ns, frame);
    Reason::ALL.into_iter().find(|r| delta.get(*r).packets == 1).expect("one reason counted")
}

/// Default-class bucket key of an IPv4 prefix (address already masked).
#[must_use]
pub fn v4_key(addr: [u8; 4], len: u8) -> BucketKey {
    BucketKey { family: family::IPV4, prefix_len: len, class: 0, pad: 0, addr: [u32::from_ne_bytes(addr), 0] }
}

/// Default-class bucket key of an IPv6 prefix (address already masked).
#[must_use]
pub fn v6_key(addr: &str, len: u8) -> BucketKey {
    let o = addr.parse::<std::net::Ipv6Addr>().expect("an IPv6 address").octets();
    let addr = std::array::from_fn(|i| u32::from_ne_bytes([o[i * 4], o[i * 4 + 1], o[i * 4 + 2], o[i * 4 + 3]]));
    BucketKey { family: family::IPV6, prefix_len: len, class: 0, pad: 0, addr }
}

/// A directory of this test process's own, removed on drop (also when the
/// test fails).
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("limiter-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Move the calling thread to `cpu`: BPF_PROG_TEST_RUN runs the program
/// on the CPU of the thread that calls it, so tests pick each packet's CPU.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set)
    };
    assert_eq!(rc, 0, "sched_setaffinity to CPU {cpu}: {}", std::io::Error::last_os_error());
}

/// Packets the pinned program in `pins` dropped as rate-limited (its
/// `STATS` map, default class, all CPUs).
#[must_use]
pub fn pinned_rate_limited(pins: &std::path::Path) -> u64 {
    use aya::maps::{Map, MapData, PerCpuArray};
    let md = MapData::from_pin(pins.join(limiter_common::maps::STATS)).unwrap();
    let a: PerCpuArray<MapData, limiter_common::Counter> = PerCpuArray::try_from(Map::PerCpuArray(md)).unwrap();
    a.get(&limiter_common::stat_index(0, Reason::RateLimited, limiter_common::family::IPV4), 0)
        .unwrap()
        .iter()
        .map(|c| c.packets)
        .sum()
}

/// The bucket of `key` in the pinned program's `BUCKETS` map in `pins`.
#[must_use]
pub fn pinned_bucket(pins: &std::path::Path, key: &BucketKey) -> Option<limiter_common::BucketState> {
    use aya::maps::{HashMap, Map, MapData};
    let md = MapData::from_pin(pins.join(limiter_common::maps::BUCKETS)).unwrap();
    let m: HashMap<MapData, BucketKey, limiter_common::BucketState> = HashMap::try_from(Map::LruHashMap(md)).unwrap();
    m.get(key, 0).ok()
}

/// The running kernel's release (`uname -r`).
#[must_use]
pub fn release() -> String {
    limiter::dataplane::kernel::release()
}

/// The major and minor version of a release string.
#[must_use]
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    limiter::dataplane::kernel::version(release)
}
