//! What the speaker's thread last found and did, as `limiter upstream
//! list`, `limiter status` and the metrics show it.

use serde::{Deserialize, Serialize};

/// What the thread last found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The speaker answered its last check.
    pub speaker_up: bool,
    /// Each neighbour of the speaker and whether its session is up.
    pub neighbours: Vec<(String, bool)>,
    /// Rules the speaker holds for the daemon.
    pub announced: usize,
    /// Rules wanted and not yet sent (the change budget, the speaker down).
    pub pending: usize,
    pub announcements: u64,
    pub withdrawals: u64,
    /// Commands the speaker refused or did not answer.
    pub failures: u64,
    /// Times the speaker was found without what it had been given.
    pub reannounced: u64,
    pub last_error: Option<String>,
}
