//! Second handles on the window maps, for the daemon's loop to read.

use aya::maps::{HashMap, MapData};
use limiter_common::BucketKey;

use crate::dataplane::maps::WindowMaps;

/// Read-only handles on `WINDOWS` and `FLEET` for `limiter prefix show`
/// (the sync owns the writable ones).
pub struct Readers {
    pub windows: HashMap<MapData, BucketKey, limiter_common::window::WindowState>,
    pub fleet: HashMap<MapData, BucketKey, limiter_common::window::WindowState>,
}

impl Readers {
    /// Second handles on the maps of `w`.
    pub fn of(w: &WindowMaps) -> Result<Self, aya::maps::MapError> {
        use aya::maps::{IterableMap as _, Map};
        let open = |m: &MapData| -> Result<HashMap<MapData, BucketKey, _>, aya::maps::MapError> {
            let id = m.info()?.id();
            HashMap::try_from(Map::LruHashMap(MapData::from_id(id)?))
        };
        Ok(Self { windows: open(w.windows.map())?, fleet: open(w.fleet.map())? })
    }
}
