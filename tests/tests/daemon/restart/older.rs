//! What an older build leaves pinned, for the upgrade test: maps of
//! another layout made with `bpftool`, and what the upgrade must carry
//! over of them.

use super::*;

/// `bpftool` with `args`, which must succeed.
pub(super) fn bpftool(args: &[&str]) {
    let o = std::process::Command::new("bpftool").args(args).output().unwrap();
    assert!(o.status.success(), "bpftool {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Pin at `dir/file` a new map named `name` of `kind` with a 4-byte key
/// (16 bytes for a hash map).
pub(super) fn create_pinned(dir: &Path, file: &str, name: &str, kind: &str, value: usize, entries: usize) -> MapData {
    let p = dir.join(file);
    let _ = std::fs::remove_file(&p);
    let (value, entries) = (value.to_string(), entries.to_string());
    let key = if kind == "hash" { "16" } else { "4" };
    let path = p.to_str().unwrap();
    bpftool(&["map", "create", path, "type", kind, "key", key, "value", &value, "entries", &entries, "name", name]);
    MapData::from_pin(&p).unwrap()
}

/// What [`leave_older_build`] left that the upgrade must carry over.
pub(super) struct Older {
    pub(super) config_size: usize,
    guard: limiter_common::cookie::SynGuard,
    stats_len: usize,
    counted: Vec<limiter_common::Counter>,
}

/// Replace pins in `dir` with what an older build would have left:
/// `CONFIG` of another layout (holding policy version 1000); `SYN_GUARD`
/// with fewer entries (one per class), the second holding a count;
/// `STATS` with one entry fewer (as before a reason was added), its first
/// counting on every CPU; and the pin of an upgrade interrupted before.
pub(super) fn leave_older_build(dir: &Path) -> Older {
    use limiter_common::{Counter, cookie::SynGuard};
    let config_size = size_of::<limiter_common::Config>() - 8;
    create_pinned(dir, maps::CONFIG, maps::CONFIG, "array", config_size, 2);
    let mut value: Vec<String> = vec!["0".into(); config_size];
    value[..8].clone_from_slice(&1000u64.to_le_bytes().map(|b| b.to_string()));
    let path = dir.join(maps::CONFIG);
    let mut update = vec!["map", "update", "pinned", path.to_str().unwrap(), "key", "0", "0", "0", "0", "value"];
    update.extend(value.iter().map(String::as_str));
    bpftool(&update);

    let guard = SynGuard { period: 7, count: 9, until: 11 };
    let md = create_pinned(dir, maps::SYN_GUARD, maps::SYN_GUARD, "array", size_of::<SynGuard>(), 2);
    aya::maps::Array::<_, SynGuard>::try_from(Map::Array(md)).unwrap().set(1, guard, 0).unwrap();

    let stats_len = limiter_common::STAT_ENTRIES;
    let md = create_pinned(dir, maps::STATS, maps::STATS, "percpu_array", size_of::<Counter>(), stats_len - 1);
    let cpus = aya::util::nr_cpus().unwrap() as u64;
    let counted: Vec<_> = (0..cpus).map(|c| Counter { packets: 1_000_000 + c, bytes: 64_000_000 }).collect();
    let mut stats = aya::maps::PerCpuArray::<_, Counter>::try_from(Map::PerCpuArray(md)).unwrap();
    stats.set(0, aya::maps::PerCpuValues::try_from(counted.clone()).unwrap(), 0).unwrap();

    // Of a size nothing uses: adopted, it would fail the new program.
    let stray = format!("{}{}", maps::CONFIG, limiter::dataplane::pin::NEW_SUFFIX);
    create_pinned(dir, &stray, maps::CONFIG, "array", 8, 2);
    // A map of schema 11 this build counts in STATS instead.
    create_pinned(dir, maps::CLASS_STATS, maps::CLASS_STATS, "percpu_array", 48, limiter_common::MAX_CLASSES);
    Older { config_size, guard, stats_len, counted }
}

/// `SYN_GUARD` and `STATS`, renewed with the entries they held.
pub(super) fn check_copied(dir: &Path, old: &Older, log: &str) {
    use limiter_common::{Counter, cookie::SynGuard};
    let copied = |m: &str, n: usize, of: usize| {
        format!("pinned {m} renewed ({n} entries, this build's {of}); its {n} entries were copied over")
    };
    assert!(log.contains(&copied(maps::SYN_GUARD, 2, limiter_common::MAX_CLASSES)), "{log}");
    assert!(log.contains(&copied(maps::STATS, old.stats_len - 1, old.stats_len)), "{log}");
    let md = MapData::from_pin(dir.join(maps::SYN_GUARD)).unwrap();
    let guard = aya::maps::Array::<_, SynGuard>::try_from(Map::Array(md)).unwrap();
    assert_eq!(guard.len() as usize, limiter_common::MAX_CLASSES);
    assert_eq!(guard.get(&1, 0).unwrap(), old.guard);
    let md = MapData::from_pin(dir.join(maps::STATS)).unwrap();
    let stats = aya::maps::PerCpuArray::<_, Counter>::try_from(Map::PerCpuArray(md)).unwrap();
    assert_eq!(stats.len() as usize, old.stats_len);
    for (now, before) in stats.get(&0, 0).unwrap().iter().zip(&old.counted) {
        assert!(now.packets >= before.packets && now.bytes >= before.bytes, "STATS lost counts: {now:?} < {before:?}");
    }
}
