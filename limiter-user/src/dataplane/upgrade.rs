//! Upgrades and rollbacks over pins another build left: which pinned maps
//! are re-adopted as they are, which renewed (made new beside the old,
//! put in place once the new program is on the link), what a renewal
//! carries over, and the table of what changed when (`LAYOUT`) that lets
//! an older build roll back.

use std::path::Path;

use aya::maps::{Array, Map, MapData, MapType};
use limiter_common::{META_MAGIC, Meta, SCHEMA_VERSION, maps};

use super::{
    pin::{PINNED_MAPS, PinError, PinnedMap, RETIRED_MAPS, has_pins, new_pin},
    rawmap::{self, Cmd, elem},
};

/// The oldest schema whose pins this build adopts or upgrades from: the
/// first whose `META` and map table are as above. Older pins are refused.
pub const OLDEST_SCHEMA: u32 = 11;

/// A pinned map as found: type, key and value sizes and max entries, or
/// nothing there.
pub type Found = Option<(MapType, usize, usize, u32)>;

/// The max entries of each map of [`PINNED_MAPS`] as this build declares
/// them (`None`: sized by the policy's capacity).
#[must_use]
pub fn table_entries() -> Vec<Option<u32>> {
    PINNED_MAPS.iter().map(|m| m.entries).collect()
}

/// A pinned map an upgrade replaces with a new, empty one, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    pub name: &'static str,
    pub why: String,
    /// Only the number of entries changed (not the layout nor the
    /// meaning) and the policy does not rewrite it: its entries are
    /// copied into the new map ([`copy_entries`]).
    pub copy: bool,
    /// How many entries were copied, once they were.
    pub copied: Option<u32>,
}

/// Decide, from `META` as pinned and each map of `table` as found, which
/// pinned maps are re-adopted and which renewed: renewed are those
/// missing, of another type or size or number of entries (`entries`,
/// where given), or last changed in a schema newer
/// than the one that pinned them. Pins of a newer schema (a rollback)
/// are judged by `newer`, the newer build's own table as it pinned it in
/// `LAYOUT`: maps it changed after this build's schema are renewed.
/// Refused: pins of a newer schema without that table, pins older than
/// [`OLDEST_SCHEMA`], and a `META` that is not ours.
pub fn plan(
    meta: Option<Meta>,
    table: &[PinnedMap],
    found: &[Found],
    entries: &[Option<u32>],
    newer: Option<&[(String, u32)]>,
) -> Result<Vec<Renewal>, PlanError> {
    let Some(m) = meta.filter(|m| m.magic == META_MAGIC) else {
        return Err(PlanError::Foreign);
    };
    let newer = match (m.schema > SCHEMA_VERSION, newer) {
        (false, _) => None,
        (true, Some(n)) => Some(n),
        (true, None) => return Err(PlanError::NewerUnlisted { schema: m.schema }),
    };
    // Whether the map changed after what the pins' build and this one
    // share: on an upgrade, after the schema that pinned it (this build's
    // table says); on a rollback, after this build's schema (the newer
    // build's table, pinned in LAYOUT, says).
    let changed = |name: &str, since: u32| match newer {
        Some(n) => match n.iter().find(|(k, _)| k == name) {
            None => Some(format!("not in the layout of schema {}", m.schema)),
            Some(&(_, s)) if s > SCHEMA_VERSION => Some(format!("changed in schema {s}, after this build's")),
            Some(_) => None,
        },
        None => (m.schema < since).then(|| format!("pinned under schema {}, changed in schema {since}", m.schema)),
    };
    if m.schema < OLDEST_SCHEMA {
        return Err(PlanError::TooOld(m.schema));
    }
    let mut renew = Vec::new();
    for ((&PinnedMap { name, kind, key, value, since, .. }, found), &want) in table.iter().zip(found).zip(entries) {
        let (why, copy) = match (*found, changed(name, since)) {
            (None, _) => ("missing".to_owned(), false),
            (Some((k, ..)), _) if k != kind => (format!("type {k:?}, this build's {kind:?}"), false),
            (Some((_, k, v, _)), _) if (k, v) != (key, value) => {
                (format!("key/value sizes {k}/{v}, this build's {key}/{value}"), false)
            }
            (Some(_), Some(why)) => (why, false),
            // Same layout and meaning, another size: what it holds fits.
            (Some((.., n)), None) if want.is_some_and(|w| w != n) => {
                let copy = !POLICY_MAPS.contains(&name);
                (format!("{n} entries, this build's {}", want.unwrap_or_default()), copy)
            }
            (Some(_), None) => continue,
        };
        if name == maps::META {
            return Err(PlanError::Meta(why));
        }
        renew.push(Renewal { name, why, copy, copied: None });
    }
    // The policy's maps go together: `ACTIVE` picks a slot of `CONFIG`
    // and of the override tries, and the old program reads them until
    // the new one is on the link, so a new `CONFIG` beside an old
    // `ACTIVE` would flip the old program to a slot it never had written.
    if renew.iter().any(|r| POLICY_MAPS.contains(&r.name)) {
        for PinnedMap { name, .. } in table {
            if POLICY_MAPS.contains(name) && !renew.iter().any(|r| r.name == *name) {
                renew.push(Renewal {
                    name,
                    why: "renewed with the policy's other maps".into(),
                    copy: false,
                    copied: None,
                });
            }
        }
    }
    Ok(renew)
}

/// The maps the policy is written into, selected together by `ACTIVE`'s
/// slot: renewed all together or not at all.
pub const POLICY_MAPS: [&str; 7] =
    [maps::CONFIG, maps::ACTIVE, maps::OVR4[0], maps::OVR4[1], maps::OVR6[0], maps::OVR6[1], maps::OVR_LIMITS];

/// What renewing a pinned map loses, for the operator.
#[must_use]
pub fn renewal_loss(r: &Renewal) -> String {
    match r.copied {
        Some(n) => format!(
            "its {n} entries were copied over (what the old program counted between the copy and the swap is not)"
        ),
        None => renewal_loss_of(r.name).to_owned(),
    }
}

/// What renewing the pinned map `name` empty loses.
fn renewal_loss_of(name: &str) -> &'static str {
    match name {
        maps::BUCKETS => "every prefix starts again from a full bucket",
        maps::WINDOWS | maps::FLEET | maps::FLEET_STATE => "window quotas start again from zero",
        maps::NEW_SOURCES => "the new-source budget starts full",
        maps::STATS | maps::GROUP_HITS | maps::TUNNEL_HITS | maps::TUNNEL_OUTCOMES => {
            "its counters start again from zero"
        }
        maps::TUNNEL_CONNS => {
            "each forwarded connection picks its backend again (the same one unless the pool changed)"
        }
        maps::TUNNEL_BACKENDS => {
            "the operator's backend drains are gone (drain them again); backends that were down start up"
        }
        maps::RUNTIME => "overrides set with `limiter prefix` before the upgrade are gone: set them again",
        maps::SYN_GUARD => "an engaged `auto` SYN-cookie trigger is released until the next SYN flood trips it",
        maps::LAYOUT => "nothing is lost: this build's table is written into it",
        _ => "nothing is lost: the policy is written into it again",
    }
}

/// Check pinned maps before re-adopting them: `None` when nothing is
/// pinned yet; else the maps an upgrade renews ([`plan`]), all others
/// being re-adopted as they are. `META` itself is never renewed: pins
/// without a readable one of ours are refused.
pub fn check(dir: &Path) -> Result<Option<Vec<Renewal>>, PinError> {
    if !has_pins(dir) {
        return Ok(None);
    }
    let mut found = Vec::with_capacity(PINNED_MAPS.len());
    for PinnedMap { name, .. } in PINNED_MAPS {
        let path = dir.join(name);
        if !path.exists() {
            found.push(None);
            continue;
        }
        let md = MapData::from_pin(&path).map_err(|source| PinError::Open { path: path.clone(), source })?;
        let info = md.info().map_err(|source| PinError::Open { path: path.clone(), source })?;
        let kind = info.map_type().map_err(|source| PinError::Open { path: path.clone(), source })?;
        found.push(Some((kind, info.key_size() as usize, info.value_size() as usize, info.max_entries())));
    }
    let path = dir.join(maps::META);
    let meta_at = PINNED_MAPS.iter().position(|m| m.name == maps::META).expect("META is pinned");
    let PinnedMap { kind, key, value, .. } = PINNED_MAPS[meta_at];
    let meta = if found[meta_at].is_some_and(|(k, ks, vs, _)| (k, ks, vs) == (kind, key, value)) {
        let md = MapData::from_pin(&path).map_err(|source| PinError::Open { path: path.clone(), source })?;
        let a: Array<MapData, Meta> =
            Array::try_from(Map::Array(md)).map_err(|source| PinError::Open { path: path.clone(), source })?;
        Some(a.get(&0, 0).map_err(|source| PinError::Open { path: path.clone(), source })?)
    } else {
        None
    };
    let newer = read_layout(dir);
    let renew = plan(meta, &PINNED_MAPS, &found, &table_entries(), newer.as_deref())
        .map_err(|e| PinError::Incompatible { path, problem: e.to_string() })?;
    Ok(Some(renew))
}

/// Pins an upgrade refuses to take over.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no {} of this project's (magic {META_MAGIC:#x}) beside them", maps::META)]
    Foreign,
    #[error(
        "schema {schema}, written by a newer limiter that does not say which maps it changed (no {layout}); this one \
         uses schema {SCHEMA_VERSION}",
        layout = maps::LAYOUT
    )]
    NewerUnlisted { schema: u32 },
    #[error("schema {0}, this limiter uses schema {SCHEMA_VERSION} and upgrades from schema {OLDEST_SCHEMA} on")]
    TooOld(u32),
    #[error("{meta} {0}", meta = maps::META)]
    Meta(String),
}

/// `LAYOUT`'s key for the map `name`: its name, zero-padded.
fn layout_key(name: &str) -> [u8; 16] {
    let mut k = [0u8; 16];
    let n = name.len().min(16);
    k[..n].copy_from_slice(&name.as_bytes()[..n]);
    k
}

/// The pinned `LAYOUT` (each map's name and the schema it last changed
/// in, by the build that pinned them), if there is a readable one.
fn read_layout(dir: &Path) -> Option<Vec<(String, u32)>> {
    let md = MapData::from_pin(dir.join(maps::LAYOUT)).ok()?;
    let m: aya::maps::HashMap<MapData, [u8; 16], u32> = aya::maps::HashMap::try_from(Map::HashMap(md)).ok()?;
    let entries = m.iter().take(maps::LAYOUT_ENTRIES as usize).flatten();
    Some(entries.map(|(k, v)| (String::from_utf8_lossy(&k).trim_end_matches('\0').to_owned(), v)).collect())
}

/// Write this build's [`PINNED_MAPS`] table into the pinned `LAYOUT`, for
/// an older build that may roll back onto these pins.
pub fn write_layout(dir: &Path) -> Result<(), PinError> {
    let path = dir.join(maps::LAYOUT);
    let open = |source| PinError::Open { path: path.clone(), source };
    let md = MapData::from_pin(&path).map_err(open)?;
    let mut m: aya::maps::HashMap<MapData, [u8; 16], u32> =
        aya::maps::HashMap::try_from(Map::HashMap(md)).map_err(open)?;
    let stale: Vec<[u8; 16]> = m.keys().flatten().collect();
    for k in stale {
        let _ = m.remove(&k);
    }
    for PinnedMap { name, since, .. } in PINNED_MAPS {
        m.insert(layout_key(name), since, 0).map_err(open)?;
    }
    Ok(())
}

/// The policy version a pinned `CONFIG` of any layout holds (the larger
/// of its two slots; 0 if unreadable): `version` is the first field of
/// every layout of `Config`, so a renewed `CONFIG` continues the count
/// and no bucket's cached resolution of an older policy can match a new
/// one by its number.
#[must_use]
pub fn pinned_config_version(path: &Path) -> u64 {
    let Ok(md) = MapData::from_pin(path) else { return 0 };
    let Ok(info) = md.info() else { return 0 };
    let size = info.value_size() as usize;
    if info.key_size() != 4 || size < 8 {
        return 0;
    }
    (0u32..2)
        .filter_map(|slot| {
            let mut value = vec![0u8; size];
            elem(&md, Cmd::Lookup, &slot.to_ne_bytes(), value.as_mut_ptr()).ok()?;
            Some(u64::from_ne_bytes(value[..8].try_into().expect("8 bytes")))
        })
        .max()
        .unwrap_or(0)
}

/// Copy the entries of the pinned map at `from` into the one at `to`, of
/// the same type and key and value sizes but another number of entries
/// (arrays: the indexes both have; hash maps: every key while there is
/// room). Returns how many were copied.
pub fn copy_entries(from: &Path, to: &Path) -> Result<u32, CopyError> {
    let open =
        |p: &Path| MapData::from_pin(p).map_err(|e| CopyError::Open { path: p.to_path_buf(), cause: e.to_string() });
    let (old, new) = (open(from)?, open(to)?);
    let mut copied = 0;
    rawmap::for_each_entry(&old, |key, value| {
        if rawmap::update(&new, key, value).is_ok() {
            copied += 1;
        }
    })
    .map_err(|e| CopyError::Read { path: from.to_path_buf(), cause: e.to_string() })?;
    Ok(copied)
}

/// A renewed map whose entries were not copied.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{}: {cause}", path.display())]
    Open { path: std::path::PathBuf, cause: String },
    #[error("{}: {cause}", path.display())]
    Read { path: std::path::PathBuf, cause: String },
}

/// Put renewed maps' pins in place of the old ones (each rename replaces
/// the old pin at once), once the new program is on the link, and remove
/// the pins of maps this build no longer has ([`RETIRED_MAPS`]). Returns
/// the retired pins removed.
pub fn finish_renewal(dir: &Path, renew: &[Renewal]) -> Result<Vec<&'static str>, PinError> {
    for r in renew {
        let (from, to) = (new_pin(dir, r.name), dir.join(r.name));
        std::fs::rename(&from, &to).map_err(|source| PinError::Rename { path: to, source })?;
    }
    let mut removed = Vec::new();
    for name in RETIRED_MAPS {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(PinError::Remove { path, source }),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
