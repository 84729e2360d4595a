//! Files of records, one JSON line each, that the daemon keeps under its
//! state directory (the audit trail's history, the attacks): bounded and
//! rotated (`FILE`, then `FILE.1`: at most twice the bound on disk), read
//! back when the daemon starts, and written off the daemon's loop by a
//! thread of their own behind a bounded queue: a slow disk loses records
//! (counted and said in the log), never the loop's time.

use std::{
    collections::VecDeque,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

/// Lines waiting for the writer.
const QUEUE: usize = 1_024;

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

/// The last `n` records of `path` and the one before it (each at most
/// `max` bytes), oldest first; lines that do not read as a record are
/// skipped.
#[must_use]
pub fn read_back<T: DeserializeOwned>(path: &Path, n: usize, max: u64) -> VecDeque<T> {
    let mut out = VecDeque::with_capacity(n);
    for p in [rotated(path), path.to_owned()] {
        let Ok(text) = crate::policy::file::read_text(&p, max * 2, "a records file") else { continue };
        for r in text.lines().filter_map(|l| serde_json::from_str::<T>(l).ok()) {
            if out.len() == n {
                out.pop_front();
            }
            out.push_back(r);
        }
    }
    out
}

/// The writer thread of one file: lines in, appended (rotated at `max`).
#[derive(Debug)]
pub struct Writer {
    name: String,
    tx: std::sync::mpsc::SyncSender<String>,
    /// Records the queue had no room for.
    lost: u64,
}

impl Writer {
    /// A thread named `name` writing to `path`.
    #[must_use]
    pub fn start(name: &str, path: PathBuf, max: u64) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(QUEUE);
        let tx = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut failing = false;
                for line in rx {
                    match append(&path, &line, max) {
                        Ok(()) => failing = false,
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!("limiter: {}: {e}; records are kept in memory only", path.display());
                        }
                        Err(_) => {}
                    }
                }
            })
            .map_or_else(|_| std::sync::mpsc::sync_channel(0).0, |_| tx);
        Self { name: name.to_owned(), tx, lost: 0 }
    }

    /// Queue `record` as one line; one the queue has no room for (the
    /// disk is slow) is counted, and said in the log at each power of two.
    pub fn write(&mut self, record: &impl serde::Serialize) {
        if serde_json::to_string(record).is_ok_and(|line| self.tx.try_send(line).is_ok()) {
            return;
        }
        self.lost += 1;
        if self.lost.is_power_of_two() {
            tracing::warn!(
                "limiter: {}: {} record(s) not written (the disk is slow); the log has them",
                self.name,
                self.lost
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct R {
        at: u64,
        what: String,
    }

    #[test]
    fn the_file_rotates_past_its_size_and_the_last_records_read_back() {
        let dir = std::env::temp_dir().join(format!("limiter-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("records.jsonl");
        let line = |at| serde_json::to_string(&R { at, what: format!("change {at}") }).unwrap();
        let max = (line(10).len() as u64 + 1) * 10;
        for i in 0..25 {
            append(&path, &line(i), max).unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() <= max);
        assert!(std::fs::metadata(rotated(&path)).unwrap().len() <= max);
        let back: VecDeque<R> = read_back(&path, 15, max);
        let ats: Vec<u64> = back.iter().map(|r| r.at).collect();
        assert_eq!(ats, (10..25).collect::<Vec<_>>(), "the newest, in order, across the two files");
        std::fs::write(&path, "not json\n").unwrap();
        assert_eq!(read_back::<R>(&path, 15, max).len(), 10, "a line that is not a record is skipped");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
