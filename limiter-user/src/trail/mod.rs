//! The audit trail: every change of the policy state, whoever made it and
//! how it went, as one log line and one JSON line ([`Record`]) in a
//! history file that is bounded and rotated (`FILE`, then `FILE.1`), and
//! as the last records in memory for `limiter history` (read back from
//! the file when the daemon starts). Writing is off the daemon's loop, on
//! a thread of its own behind a bounded queue: a slow disk loses records
//! (counted, said in the log), never the loop's time.

pub mod feature;

use std::{
    collections::VecDeque,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use crate::control::Record;

/// A history file is rotated past this size (the one before is kept as
/// `FILE.1`: at most twice this on disk).
pub const MAX_FILE: u64 = 4 << 20;
/// Records kept in memory for `limiter history`.
pub const KEPT: usize = 2_000;
/// Records waiting for the writer.
const QUEUE: usize = 1_024;
/// The longest record line written (a longer change or result is cut).
pub const MAX_FIELD: usize = 1_024;

/// `FILE.1`.
fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// Append `line` to `path`, rotating it first when it would pass `max`.
pub fn append(path: &Path, line: &str, max: u64) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() + line.len() as u64 + 1 > max) {
        std::fs::rename(path, rotated(path))?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(0o640).open(path)?;
    writeln!(f, "{line}")
}

/// The last `n` records of the history file and the one before it, oldest
/// first (lines that do not read as a record are skipped).
#[must_use]
pub fn read_back(path: &Path, n: usize) -> VecDeque<Record> {
    let mut out = VecDeque::with_capacity(n);
    for p in [rotated(path), path.to_owned()] {
        let Ok(text) = crate::policy::file::read_text(&p, MAX_FILE * 2, "a history file") else { continue };
        for r in text.lines().filter_map(|l| serde_json::from_str::<Record>(l).ok()) {
            if out.len() == n {
                out.pop_front();
            }
            out.push_back(r);
        }
    }
    out
}

/// `text` cut to [`MAX_FIELD`] bytes (at a character boundary) and with
/// control characters escaped: a record is one line.
#[must_use]
pub fn field(text: &str) -> String {
    crate::one_line(text, MAX_FIELD)
}

/// The writer thread: records in, lines out to the file.
#[derive(Debug)]
struct Writer {
    tx: std::sync::mpsc::SyncSender<String>,
}

impl Writer {
    fn start(path: PathBuf) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(QUEUE);
        std::thread::Builder::new()
            .name("history".into())
            .spawn(move || {
                let mut failing = false;
                for line in rx {
                    match append(&path, &line, MAX_FILE) {
                        Ok(()) => failing = false,
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!("limiter: history {}: {e}; records are kept in memory only", path.display());
                        }
                        Err(_) => {}
                    }
                }
            })
            .map_or_else(|_| Self { tx: std::sync::mpsc::sync_channel(0).0 }, |_| Self { tx })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> Record {
        Record { at: i, version: i, by: "uid 0".into(), change: format!("change {i}"), ok: true, result: "r".into() }
    }

    #[test]
    fn the_file_rotates_past_its_size_and_the_last_records_read_back() {
        let dir = std::env::temp_dir().join(format!("limiter-trail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let line = |i| serde_json::to_string(&record(i)).unwrap();
        let max = (line(10).len() as u64 + 1) * 10;
        for i in 0..25 {
            append(&path, &line(i), max).unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() <= max);
        assert!(std::fs::metadata(rotated(&path)).unwrap().len() <= max);
        let back = read_back(&path, 15);
        let ats: Vec<u64> = back.iter().map(|r| r.at).collect();
        assert_eq!(ats, (10..25).collect::<Vec<_>>(), "the newest, in order, across the two files");
        std::fs::write(&path, "not json\n").unwrap();
        assert_eq!(read_back(&path, 15).len(), 10, "a line that is not a record is skipped");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_field_is_one_bounded_line() {
        assert_eq!(field("a\nb"), "a\\u{a}b");
        let long = "é".repeat(MAX_FIELD);
        let cut = field(&long);
        assert!(cut.len() <= MAX_FIELD + 3 && cut.ends_with("..."));
    }
}
