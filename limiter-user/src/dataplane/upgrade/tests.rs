//! What `plan` renews, keeps or refuses for pins of every kind of build.

use limiter_common::{BucketKey, BucketState, ClassLimits, Config, Counter};

use super::*;

fn ours(schema: u32) -> Meta {
    Meta { magic: META_MAGIC, schema, ifindex: 0, pad: 0 }
}

/// Every map of the table as this build makes it.
fn as_built() -> Vec<Found> {
    PINNED_MAPS.iter().zip(entries()).map(|(m, n)| Some((m.kind, m.key, m.value, n.unwrap_or(1024)))).collect()
}

/// The production object's own.
fn entries() -> Vec<Option<u32>> {
    table_entries()
}

fn at(name: &str) -> usize {
    PINNED_MAPS.iter().position(|m| m.name == name).unwrap()
}

fn names(r: &[Renewal]) -> Vec<&str> {
    let mut n: Vec<&str> = r.iter().map(|r| r.name).collect();
    n.sort_unstable();
    n
}

#[test]
fn pins_of_this_build_are_all_re_adopted() {
    assert_eq!(plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &as_built(), &entries(), None), Ok(vec![]));
}

#[test]
fn a_map_of_another_layout_or_missing_is_renewed_alone() {
    let mut found = as_built();
    found[at(maps::STATS)] = Some((MapType::PerCpuArray, 4, 8, 1));
    found[at(maps::SYN_GUARD)] = None;
    let r = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap();
    assert_eq!(names(&r), [maps::STATS, maps::SYN_GUARD]);
    assert!(r[0].why.contains("key/value sizes 4/8"), "{r:?}");
    assert_eq!(r[1].why, "missing");
    found[at(maps::STATS)] = Some((MapType::Array, 4, size_of::<Counter>(), 1));
    let r = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap();
    assert!(r[0].why.contains("type Array"), "{r:?}");
}

/// A build that counts more reasons has a longer `STATS` at the same
/// sizes: its lookups past the old end would find nothing and count
/// nothing. The buckets' number of entries is the policy's capacity,
/// kept whatever it is.
#[test]
fn a_map_of_another_number_of_entries_is_renewed_but_the_buckets_are_kept() {
    let mut found = as_built();
    let stats = entries()[at(maps::STATS)].unwrap();
    found[at(maps::STATS)] = Some((MapType::PerCpuArray, 4, size_of::<Counter>(), stats - 3));
    found[at(maps::BUCKETS)] = Some((MapType::LruHash, size_of::<BucketKey>(), size_of::<BucketState>(), 7));
    let r = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap();
    assert_eq!(names(&r), [maps::STATS]);
    assert_eq!(r[0].why, format!("{} entries, this build's {stats}", stats - 3));
    assert!(r[0].copy, "same layout, same meaning: its entries are copied");
    // A policy map of another length is written again, not copied.
    let mut found = as_built();
    let limits = entries()[at(maps::OVR_LIMITS)].unwrap();
    found[at(maps::OVR_LIMITS)] = Some((MapType::Array, 4, size_of::<ClassLimits>(), limits / 2));
    let r = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap();
    assert_eq!(r.len(), POLICY_MAPS.len());
    assert!(r.iter().all(|r| !r.copy), "{r:?}");
}

#[test]
fn a_policy_map_renews_the_policy_maps_and_nothing_else() {
    let mut found = as_built();
    found[at(maps::CONFIG)] = Some((MapType::Array, 4, size_of::<Config>() - 8, 2));
    let r = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap();
    let mut want = POLICY_MAPS.to_vec();
    want.sort_unstable();
    assert_eq!(names(&r), want);
    assert!(!names(&r).contains(&maps::BUCKETS));
}

#[test]
fn a_map_changed_since_the_pinning_schema_is_renewed_even_at_the_same_size() {
    let mut table = PINNED_MAPS;
    table[at(maps::RUNTIME)].since = SCHEMA_VERSION + 1;
    let r = plan(Some(ours(SCHEMA_VERSION)), &table, &as_built(), &entries(), None).unwrap();
    assert_eq!(names(&r), [maps::RUNTIME]);
    assert!(r[0].why.contains(&format!("changed in schema {}", SCHEMA_VERSION + 1)), "{r:?}");
}

/// A rollback: the newer build's own table (pinned in LAYOUT) says
/// which maps changed after this build's schema; those are renewed,
/// the rest kept, a map it does not list renewed too.
#[test]
fn a_rollback_renews_what_the_newer_build_changed_after_this_one() {
    let newer = SCHEMA_VERSION + 2;
    let mut layout: Vec<(String, u32)> = PINNED_MAPS.iter().map(|m| (m.name.to_owned(), m.since)).collect();
    let r = plan(Some(ours(newer)), &PINNED_MAPS, &as_built(), &entries(), Some(&layout)).unwrap();
    assert_eq!(r, vec![]);
    layout.iter_mut().find(|(n, _)| n == maps::STATS).unwrap().1 = SCHEMA_VERSION + 1;
    layout.retain(|(n, _)| n != maps::SYN_GUARD);
    let r = plan(Some(ours(newer)), &PINNED_MAPS, &as_built(), &entries(), Some(&layout)).unwrap();
    assert_eq!(names(&r), [maps::STATS, maps::SYN_GUARD]);
    assert_eq!(r[0].why, format!("changed in schema {}, after this build's", SCHEMA_VERSION + 1));
    assert_eq!(r[1].why, format!("not in the layout of schema {newer}"));
    assert!(r.iter().all(|r| !r.copy));
}

#[test]
fn newer_older_or_foreign_pins_are_refused() {
    let e = plan(Some(ours(SCHEMA_VERSION + 1)), &PINNED_MAPS, &as_built(), &entries(), None).unwrap_err().to_string();
    assert!(e.contains("newer limiter") && e.contains("does not say which maps it changed"), "{e}");
    let e = plan(Some(ours(OLDEST_SCHEMA - 1)), &PINNED_MAPS, &as_built(), &entries(), None).unwrap_err().to_string();
    assert!(e.contains(&format!("upgrades from schema {OLDEST_SCHEMA}")), "{e}");
    let mut found = as_built();
    found[at(maps::META)] = Some((MapType::Array, 4, size_of::<Meta>(), 2));
    let e = plan(Some(ours(SCHEMA_VERSION)), &PINNED_MAPS, &found, &entries(), None).unwrap_err().to_string();
    assert_eq!(e, "META 2 entries, this build's 1");
    let foreign = Some(Meta { magic: 1, schema: SCHEMA_VERSION, ifindex: 0, pad: 0 });
    assert!(plan(foreign, &PINNED_MAPS, &as_built(), &entries(), None).unwrap_err().to_string().contains("no META"));
    assert!(plan(None, &PINNED_MAPS, &as_built(), &entries(), None).is_err());
}

/// The object the program is built into has every map of the table as
/// its row says (kind, sizes, entries, flags): the row is what pinning,
/// upgrades and the program's declarations all read.
#[test]
fn the_object_declares_every_map_of_the_table_as_its_row() {
    let obj = aya_obj::Object::parse(crate::dataplane::OBJECT).unwrap();
    for row in maps::TABLE {
        let m = obj.maps.get(row.name).unwrap_or_else(|| panic!("{} is not in the object", row.name));
        assert_eq!(m.map_type(), crate::dataplane::pin::map_type(row.kind) as u32, "{}", row.name);
        let sizes = if row.kind == maps::Kind::RingBuf { (0, 0) } else { (row.key, row.value) };
        assert_eq!((m.key_size() as usize, m.value_size() as usize), sizes, "{}", row.name);
        assert_eq!(m.max_entries(), row.entries, "{}", row.name);
        // aya makes LPM tries without preallocation whatever is asked.
        let flags = if row.kind == maps::Kind::LpmTrie { m.map_flags() & !maps::NO_PREALLOC } else { m.map_flags() };
        assert_eq!(flags, row.flags, "{}", row.name);
    }
    // Not ours: the program's constants (`.rodata`) and aya-log's buffer.
    let others: Vec<&String> = obj
        .maps
        .keys()
        .filter(|n| !maps::TABLE.iter().any(|r| r.name == n.as_str()) && !matches!(n.as_str(), ".rodata" | "AYA_LOGS"))
        .collect();
    assert!(others.is_empty(), "maps of the object not in the table: {others:?}");
}
