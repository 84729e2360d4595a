//! A daemon's policy with a `[feedback]` section, as the feedback tests
//! write it.

use std::path::{Path, PathBuf};

/// Write `token` to a file in `dir` and a policy (rate 1000, burst 2000)
/// whose `[feedback]` listens on 127.0.0.1:9465 with that token file,
/// followed by `lines` (more of the section, and tables after it).
/// Returns the policy's path.
#[must_use]
pub fn policy(dir: &Path, token: &str, lines: &str) -> PathBuf {
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let policy = dir.join("policy.toml");
    let text = format!(
        "rate = 1000\nburst = 2000\n\n[feedback]\nlisten = \"127.0.0.1:9465\"\ntoken_file = \"{}\"\n{lines}",
        token_file.display()
    );
    std::fs::write(&policy, text).unwrap();
    policy
}
