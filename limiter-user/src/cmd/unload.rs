//! `limiter unload`: remove the pins; the link goes with its last pin.

use std::path::{Path, PathBuf};

use super::{entries, only_one};
use crate::{cli::UnloadArgs, dataplane::pin};

pub fn unload(args: &UnloadArgs, json: bool) -> anyhow::Result<()> {
    let dir = match &args.pin_dir {
        Some(d) => d.clone(),
        None => default_pin_dir(Path::new(pin::DEFAULT_PIN_DIR))?,
    };
    let (removed, kept_for_daemon) = pin::unload_checked(&dir, args.keep_maps, args.force)?;
    if json {
        let doc = serde_json::json!({
            "pin_dir": dir,
            "removed": removed,
            "kept_maps": args.keep_maps || kept_for_daemon,
            "daemon_running": kept_for_daemon,
        });
        return super::print_json(&doc);
    }
    if kept_for_daemon {
        eprintln!(
            "limiter: a running daemon serves {}: its maps stay (it needs them to attach again, within a second); stop it first to remove them",
            dir.display()
        );
    }
    if removed.is_empty() {
        println!("limiter: nothing pinned in {}", dir.display());
    } else {
        println!("limiter: removed {} from {}", removed.join(", "), dir.display());
    }
    Ok(())
}

/// The pin directory `unload` works on when `--pin-dir` is not given:
/// `default` if anything is pinned there; else, where `limiter@IFACE`
/// services pin (`default` with `-IFACE` appended, beside it), the only
/// such directory that holds pins; with several, an error that names
/// them. Mirrors how the other verbs find a service's socket.
fn default_pin_dir(default: &Path) -> anyhow::Result<PathBuf> {
    if pin::has_pins(default) {
        return Ok(default.to_owned());
    }
    let (Some(parent), Some(name)) = (default.parent(), default.file_name()) else {
        return Ok(default.to_owned());
    };
    let prefix = format!("{}-", name.to_string_lossy());
    let mut found = entries(parent, |n| n.starts_with(&prefix), 256);
    found.retain(|d| pin::has_pins(d));
    only_one(found, default, "several pin directories hold a limiter", "--pin-dir")
}

#[cfg(test)]
mod tests {
    use super::default_pin_dir;
    use crate::dataplane::pin;

    #[test]
    fn the_default_pin_dir_or_the_only_service_pin_dir_beside_it() {
        let dir = std::env::temp_dir().join(format!("limiter-pins-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let default = dir.join("limiter");
        let service = |iface: &str| {
            let d = dir.join(format!("limiter-{iface}"));
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let pin_link = |d: &std::path::Path| std::fs::write(d.join(pin::LINK), b"").unwrap();
        std::fs::create_dir_all(&default).unwrap();
        // Nothing pinned anywhere: the default (which then says so).
        assert_eq!(default_pin_dir(&default).unwrap(), default);
        // A service's directory without pins is not a candidate.
        let eth0 = service("eth0");
        assert_eq!(default_pin_dir(&default).unwrap(), default);
        // One service with pins: its directory.
        pin_link(&eth0);
        assert_eq!(default_pin_dir(&default).unwrap(), eth0);
        // Another name that only starts like the default is not a service's.
        let other = dir.join("limiterx");
        std::fs::create_dir_all(&other).unwrap();
        pin_link(&other);
        assert_eq!(default_pin_dir(&default).unwrap(), eth0);
        // Two services: an error naming both.
        let eth1 = service("eth1");
        pin_link(&eth1);
        let err = default_pin_dir(&default).unwrap_err().to_string();
        assert!(err.contains("limiter-eth0") && err.contains("limiter-eth1") && err.contains("--pin-dir"), "{err}");
        // Pins in the default directory win.
        pin_link(&default);
        assert_eq!(default_pin_dir(&default).unwrap(), default);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
