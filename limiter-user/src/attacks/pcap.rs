//! Each attack's frames as pcapng, beside the attacks file
//! (`FILE.pcap/ID.pcapng`): from its first second above a threshold,
//! every dropped frame until [`FIRST`] are kept, then about
//! [`PER_SECOND`] a second drawn at random by the data plane (one in a
//! power of two of the refused rate), until the attack ends or its file
//! reaches [`MAX_BYTES`]. Frames of a rise that never lasted `sustain`
//! are forgotten. The pcaps of all attacks stay under [`MAX_TOTAL`]: the
//! oldest are removed to make room for a new one.

use std::{
    fs::File,
    io::BufWriter,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use crate::capture::{Frame, Want, pcapng::Writer};
use crate::control::Pcap;

/// Frames kept from every drop at an attack's start.
pub const FIRST: u64 = 1_000;
/// Frames a second kept after them, about (drawn at random).
pub const PER_SECOND: u64 = 100;
/// Bytes of one attack's pcap at most.
pub const MAX_BYTES: u64 = 4 << 20;
/// Bytes of all the attacks' pcaps at most.
pub const MAX_TOTAL: u64 = 64 << 20;

/// The pcap of the attack being built.
#[derive(Debug)]
pub struct Recorder {
    dir: Option<PathBuf>,
    current: Option<Current>,
}

struct Current {
    /// Frames of a rise not yet an attack.
    held: Vec<Frame>,
    writer: Option<(Writer<BufWriter<File>>, PathBuf)>,
    frames: u64,
    full: bool,
    /// One frame in this many is asked for once [`FIRST`] are kept.
    one_in: u32,
}

impl std::fmt::Debug for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Current").field("held", &self.held.len()).field("frames", &self.frames).finish_non_exhaustive()
    }
}

impl Recorder {
    /// Pcaps kept in the folder beside `attacks_file` (none without it).
    #[must_use]
    pub fn new(attacks_file: Option<&Path>) -> Self {
        let dir = attacks_file.map(|f| {
            let mut d = f.as_os_str().to_owned();
            d.push(".pcap");
            PathBuf::from(d)
        });
        Self { dir, current: None }
    }

    /// Whether frames of a rise or an attack are being kept.
    #[must_use]
    pub fn recording(&self) -> bool {
        self.current.is_some()
    }

    /// A rise above a threshold began: keep its frames.
    pub fn begin(&mut self) {
        if self.dir.is_some() && self.current.is_none() {
            self.current = Some(Current { held: Vec::new(), writer: None, frames: 0, full: false, one_in: 1 });
        }
    }

    /// The rise did not last: forget its frames.
    pub fn abandon(&mut self) {
        self.current = None;
    }

    /// The rise is attack `id`: its file is opened and what was held
    /// written. The pcap so far (`None`: not kept, said in the log).
    pub fn started(&mut self, id: u64, class_names: &[String]) -> Option<Pcap> {
        let dir = self.dir.as_ref()?;
        let cur = self.current.as_mut()?;
        // Packets are the network's users' data: the folder and its files
        // are the daemon's and its group's only (0750, 0640), as the
        // history file is.
        let made = std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir);
        if let Err(e) = made {
            tracing::warn!("limiter: attack {id}: no pcap: creating {}: {e}", dir.display());
            self.current = None;
            return None;
        }
        prune(dir, MAX_TOTAL.saturating_sub(MAX_BYTES));
        let path = dir.join(format!("{id}.pcapng"));
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o640).open(&path);
        let writer = file.and_then(|f| Writer::new(BufWriter::new(f)));
        match writer {
            Ok(w) => cur.writer = Some((w, path)),
            Err(e) => {
                tracing::warn!("limiter: attack {id}: no pcap: writing {}: {e}", path.display());
                self.current = None;
                return None;
            }
        }
        let held = std::mem::take(&mut cur.held);
        self.frames(&held, class_names);
        self.pcap()
    }

    /// Frames the data plane copied.
    pub fn frames(&mut self, frames: &[Frame], class_names: &[String]) {
        let Some(cur) = self.current.as_mut() else { return };
        for f in frames.iter().filter(|f| f.reason.action() != limiter_common::Action::Pass) {
            if cur.full {
                return;
            }
            match &mut cur.writer {
                None if cur.held.len() < usize::try_from(FIRST).unwrap_or(usize::MAX) => cur.held.push(f.clone()),
                None => return,
                Some((w, path)) => {
                    if w.bytes >= MAX_BYTES {
                        cur.full = true;
                        return;
                    }
                    if let Err(e) = w.write(f, class_names) {
                        tracing::warn!("limiter: attack pcap {}: {e}; no more frames kept", path.display());
                        cur.full = true;
                        return;
                    }
                    cur.frames += 1;
                }
            }
        }
        if let Some((w, _)) = &mut cur.writer {
            let _ = w.flush();
        }
    }

    /// A second in which `refused` packets were refused: after the first
    /// frames, ask for about [`PER_SECOND`] a second.
    pub fn second(&mut self, refused: u64) {
        if let Some(cur) = &mut self.current {
            let n = (refused / PER_SECOND).max(1);
            cur.one_in = u32::try_from(n.next_power_of_two()).unwrap_or(1 << 31);
        }
    }

    /// What it asks of the data plane now.
    #[must_use]
    pub fn want(&self) -> Option<Want> {
        let cur = self.current.as_ref()?;
        let kept = cur.frames + cur.held.len() as u64;
        if cur.full || (cur.writer.is_none() && kept >= FIRST) {
            None
        } else if kept < FIRST {
            Some(Want::Every)
        } else {
            Some(Want::OneIn(cur.one_in))
        }
    }

    /// The pcap of the attack going on.
    #[must_use]
    pub fn pcap(&self) -> Option<Pcap> {
        let cur = self.current.as_ref()?;
        let (w, path) = cur.writer.as_ref()?;
        Some(Pcap { path: path.display().to_string(), frames: cur.frames, bytes: w.bytes, full: cur.full })
    }

    /// The attack ended: its pcap, closed.
    pub fn end(&mut self) -> Option<Pcap> {
        let pcap = self.pcap();
        if let Some(Current { writer: Some((mut w, _)), .. }) = self.current.take() {
            let _ = w.flush();
        }
        pcap
    }
}

/// Remove the oldest pcaps in `dir` until they hold at most `keep` bytes.
fn prune(dir: &Path, keep: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "pcapng"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    for (_, len, path) in files {
        if total <= keep {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "limiter: removed the oldest attack pcap {} (pcaps stay under {MAX_TOTAL} bytes)",
                path.display()
            );
            total -= len;
        }
    }
}
