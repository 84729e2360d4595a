//! The audit trail: every change of the policy state, whoever made it and
//! how it went, as one log line and one JSON line ([`Record`]) in a
//! history file that is bounded and rotated (`FILE`, then `FILE.1`), and
//! as the last records in memory for `limiter history` (read back from
//! the file when the daemon starts). Writing is off the daemon's loop
//! (`crate::records`): a slow disk loses records (counted, said in the
//! log), never the loop's time.

pub mod feature;

use crate::control::Record;

/// A history file is rotated past this size (the one before is kept as
/// `FILE.1`: at most twice this on disk).
pub const MAX_FILE: u64 = 4 << 20;
/// Records kept in memory for `limiter history`.
pub const KEPT: usize = 2_000;
/// The longest record line written (a longer change or result is cut).
pub const MAX_FIELD: usize = 1_024;

/// The last `n` records of the history file and the one before it, oldest
/// first.
#[must_use]
pub fn read_back(path: &std::path::Path, n: usize) -> std::collections::VecDeque<Record> {
    crate::records::read_back(path, n, MAX_FILE)
}

/// `text` cut to [`MAX_FIELD`] bytes (at a character boundary) and with
/// control characters escaped: a record is one line.
#[must_use]
pub fn field(text: &str) -> String {
    crate::one_line(text, MAX_FIELD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_one_bounded_line() {
        assert_eq!(field("a\nb"), "a\\u{a}b");
        let long = "é".repeat(MAX_FIELD);
        let cut = field(&long);
        assert!(cut.len() <= MAX_FIELD + 3 && cut.ends_with("..."));
    }
}
