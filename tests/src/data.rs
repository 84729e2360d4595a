//! Real, current data the tests read: the npm registry's ip-location-db
//! packages at one version (`cargo xtask setup` fetches them with `npm
//! pack` into `target/tools/ip-location-db`).

use std::path::PathBuf;

/// The version of the packages the tests read.
pub const IP_LOCATION_DB: &str = "2.3.2026061719";

/// The file `name` of the package `@ip-location-db/PACKAGE`; panics,
/// naming the command that fetches it, if it is missing.
#[must_use]
pub fn ip_location_db(package: &str, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/ip-location-db").join(package);
    assert!(
        dir.join(format!("package/.version-{IP_LOCATION_DB}")).exists(),
        "@ip-location-db/{package}@{IP_LOCATION_DB} is missing: run `cargo xtask setup`"
    );
    dir.join("package").join(name)
}
