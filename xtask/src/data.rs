//! Real, current country and ASN data for the groups' tests: the npm
//! registry's ip-location-db packages (GeoLite2 Country and the
//! WHOIS-based country database as MaxMind files, the ASN lists as CSV),
//! fetched once with `npm pack` at a pinned version (npm checks each
//! tarball against the registry's integrity hash) and unpacked under
//! `target/tools/ip-location-db/NAME/package`. The tests name the
//! version they read.

use std::{path::Path, process::Command};

/// The packages' version (all three are built together).
pub const VERSION: &str = "2.3.2026061719";
/// The packages.
pub const PACKAGES: [&str; 3] = ["geolite2-country-mmdb", "asn", "geo-whois-asn-country-mmdb"];
/// Where they are unpacked.
pub const DIR: &str = "target/tools/ip-location-db";

/// Fetch and unpack each package not yet there (at this version).
pub fn fetch() -> anyhow::Result<()> {
    if Command::new("npm").arg("--version").output().is_err() {
        crate::setup::install_missing(&["npm"])?;
    }
    let download = Path::new("target/tools/download");
    std::fs::create_dir_all(download)?;
    for name in PACKAGES {
        let dir = Path::new(DIR).join(name);
        let stamp = dir.join(format!("package/.version-{VERSION}"));
        if stamp.exists() {
            continue;
        }
        eprintln!("xtask: fetching @ip-location-db/{name}@{VERSION} from the npm registry");
        let spec = format!("@ip-location-db/{name}@{VERSION}");
        let mut tries = 0;
        loop {
            let mut pack = Command::new("npm");
            pack.args(["pack", "--silent", &spec, "--pack-destination"]).arg(download);
            match crate::run(pack) {
                Ok(()) => break,
                Err(e) if tries >= 2 => return Err(e),
                Err(e) => eprintln!("xtask: {e}; trying again"),
            }
            tries += 1;
            std::thread::sleep(std::time::Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut untar = Command::new("tar");
        untar.arg("xzf").arg(download.join(format!("ip-location-db-{name}-{VERSION}.tgz"))).arg("-C").arg(&dir);
        crate::run(untar)?;
        std::fs::write(&stamp, "")?;
    }
    Ok(())
}
