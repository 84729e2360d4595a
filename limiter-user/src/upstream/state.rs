//! The state file: the rules wanted and what the speaker was given,
//! written before each announcement (and after each withdrawal), read
//! when the daemon starts, bounded in size. Its folder may be one a
//! careless operator shares: the file is opened without following a
//! link and without blocking (a FIFO planted at its path is refused, not
//! waited on), read only if it is a regular file, and written through a
//! temporary made new (`O_EXCL`); a folder others can write is refused.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::rule::Rule;
use crate::policy::file::ReadError;

/// The state file: what is wanted and what the speaker was given.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    pub wanted: Vec<Rule>,
    pub announced: Vec<Rule>,
    /// The communities the announced routes carry.
    #[serde(default)]
    pub communities: Vec<String>,
}

/// The most a state file may be.
const MAX_STATE: u64 = 16 << 20;

impl Saved {
    /// The file at `path` (none yet: empty), read as the policy file is
    /// (bounded, a regular file only, never waited on) and without
    /// following a link.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let at = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
        if let Some(dir) = path.parent() {
            match shared(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
                r => r.map_err(|e| at(&e))?,
            }
        }
        let what = "the upstream state";
        let bytes = match crate::policy::file::read_bytes_with(path, MAX_STATE, what, libc::O_NOFOLLOW) {
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(at(&e)),
            Ok((bytes, _)) => bytes,
        };
        serde_json::from_slice(&bytes).map_err(|e| at(&e))
    }

    pub(super) fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            shared(dir)?;
        }
        let tmp = path.with_extension("tmp");
        // A temporary left by a run that died (or put there by someone
        // else) is removed, never opened: the new one is made new.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(self).unwrap_or_default())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

/// An error if others than its owner may write in `dir` (anyone could
/// then put a FIFO or a link where the state file goes).
fn shared(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(dir)?;
    if m.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by others (mode {:o}): the upstream state is kept only in a folder of its owner's",
                dir.display(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        origin::Origin,
        upstream::{Action, Key},
    };

    /// What is written is read back; no file is no rule; a file that is
    /// not the daemon's is an error, never a guess.
    #[test]
    fn the_state_file_round_trips_and_refuses_what_it_did_not_write() {
        let dir = std::env::temp_dir().join(format!("limiter-upstream-state-{}", std::process::id()));
        let path = dir.join("sub/upstream.json");
        assert!(Saved::read(&path).unwrap().wanted.is_empty());
        let r = Rule {
            key: Key::flow("198.18.80.0/24".parse().unwrap()),
            action: Action::Discard,
            by: Origin::Operator,
            since: 1,
            expires: 9,
        };
        Saved { wanted: vec![r.clone()], announced: vec![r.clone()], communities: vec!["64500:1".into()] }
            .write(&path)
            .unwrap();
        let back = Saved::read(&path).unwrap();
        assert_eq!((back.wanted, back.announced, back.communities), (vec![r.clone()], vec![r], vec!["64500:1".into()]));
        std::fs::write(&path, "{\"wanted\": 7}").unwrap();
        assert!(Saved::read(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO at the state's path is refused at once, not waited on; one
    /// at the temporary's is removed and the file written; a folder others
    /// can write is refused both ways (U4).
    #[test]
    fn planted_files_and_shared_folders_are_refused_without_a_wait() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("limiter-upstream-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.join("upstream.json");
        let fifo = |p: &Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        };
        fifo(&path);
        let e = Saved::read(&path).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_file(&path).unwrap();
        fifo(&path.with_extension("tmp"));
        Saved::default().write(&path).unwrap();
        assert!(Saved::read(&path).unwrap().wanted.is_empty());
        std::os::unix::fs::symlink("/etc/passwd", path.with_extension("tmp")).unwrap();
        Saved::default().write(&path).unwrap();
        assert!(std::fs::symlink_metadata("/etc/passwd").unwrap().is_file());
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(Saved::read(&path).is_err(), "a link is not followed");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = Saved::read(&path).unwrap_err().to_string();
        assert!(e.contains("writable by others"), "{e}");
        assert!(Saved::default().write(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
