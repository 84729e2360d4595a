//! The state file: the rules wanted and what the speaker was given,
//! written before each announcement (and after each withdrawal), read
//! when the daemon starts, bounded in size.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::rule::Rule;

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
    /// The file at `path` (none yet: empty).
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
            Ok(m) if m.len() > MAX_STATE => anyhow::bail!("{}: over {MAX_STATE} bytes", path.display()),
            Ok(_) => {}
        }
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub(super) fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&serde_json::to_vec(self).unwrap_or_default())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{Action, Key, Trigger};

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
            by: Trigger::Operator,
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
}
