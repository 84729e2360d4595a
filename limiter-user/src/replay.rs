//! `limiter replay`: run the real XDP program over a capture, offline, with
//! the capture's own timestamps fed through the injected clock, and total
//! the verdicts per source prefix. Nothing is attached to any interface.
//!
//! The capture is read as a stream (the header is checked before anything
//! else; memory stays within a bounded window of frames), and every frame
//! is charged its original length (a frame cut by the capture's snap
//! length is padded with zeros back to it). Out-of-order stamps (captures
//! from several queues interleave) are put back in order within a window
//! of [`WINDOW_FRAMES`] frames or [`WINDOW_BYTES`] bytes; a frame later
//! than that is replayed at the latest time already replayed, since the
//! data plane's clock never goes back, and counted as late.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, BufReader, Read},
    path::Path,
};

use limiter_common::{
    Config, Reason, packet,
    rules::{bucket_key, classify},
    stat_index,
};
use pcap_file::pcapng::{Block, PcapNgReader, blocks::interface_description::InterfaceDescriptionOption};
use serde::Serialize;

use crate::{
    dataplane::{DataPlane, xdp_action},
    policy::{Mode, OverrideAction, Policy},
};

/// Largest frame a capture may claim (pcap's largest snap length).
pub const MAX_FRAME: u32 = 262_144;
/// Frames held back to put out-of-order stamps in order.
pub const WINDOW_FRAMES: usize = 4096;
/// Bytes held back at most for the same.
pub const WINDOW_BYTES: usize = 16 << 20;

/// One frame of a capture.
pub struct Frame {
    /// Capture timestamp in nanoseconds.
    pub t_ns: u64,
    /// The captured bytes, padded with zeros to the original length.
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: neither pcap nor pcapng (magic {magic:#010x})")]
    Magic { path: String, magic: u32 },
    #[error("{path}: link type {linktype} is not Ethernet (1)")]
    LinkType { path: String, linktype: u32 },
    #[error("{path}: record at byte {offset} is cut short")]
    Truncated { path: String, offset: u64 },
    #[error("{path}: empty, no pcap header (a capture holds at least its 24-byte header)")]
    Empty { path: String },
    #[error("{path}: {got} bytes, shorter than a pcap header (24 bytes): not a capture, or cut short")]
    ShortHeader { path: String, got: usize },
    #[error("{path}: record at byte {offset} claims {len} bytes (at most {MAX_FRAME})")]
    BadLength { path: String, offset: u64, len: u32 },
    #[error("{path}: pcapng: {why}")]
    Ng { path: String, why: String },
}

/// A capture read one frame at a time: classic pcap (either byte order,
/// micro- or nanosecond timestamps) or pcapng (read by the `pcap-file`
/// crate: `limiter capture`'s and the attacks' own, tshark's, dumpcap's),
/// Ethernet link type.
pub struct Pcap<R: Read> {
    src: Source<R>,
    path: String,
    big_endian: bool,
    nanos: bool,
    offset: u64,
}

/// What a capture is read from.
enum Source<R: Read> {
    Classic(R),
    /// pcapng: its first bytes, read to tell it, put back before the rest.
    Ng(Box<PcapNgReader<io::Chain<io::Cursor<Vec<u8>>, R>>>),
}

/// pcapng's Section Header Block type, as its first 4 bytes.
const PCAPNG_MAGIC: u32 = 0x0a0d_0d0a;

impl Pcap<BufReader<File>> {
    /// Open `path` and check its header (nothing else is read yet).
    pub fn open(path: &Path) -> Result<Self, PcapError> {
        let name = path.display().to_string();
        let f = File::open(path).map_err(|source| PcapError::Read { path: name.clone(), source })?;
        Self::new(BufReader::new(f), name)
    }
}

impl<R: Read> Pcap<R> {
    /// Read and check the 24-byte header of `r`.
    pub fn new(mut r: R, path: String) -> Result<Self, PcapError> {
        let mut head = [0u8; 24];
        let got = read_full(&mut r, &mut head).map_err(|source| PcapError::Read { path: path.clone(), source })?;
        let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let (big_endian, nanos) = match magic {
            0xa1b2_c3d4 => (false, false),
            0xa1b2_3c4d => (false, true),
            0xd4c3_b2a1 => (true, false),
            0x4d3c_b2a1 => (true, true),
            PCAPNG_MAGIC => return Self::new_ng(r, path, head[..got].to_vec()),
            _ if got == 0 => return Err(PcapError::Empty { path }),
            _ if got < 4 => return Err(PcapError::ShortHeader { path, got }),
            magic => return Err(PcapError::Magic { path, magic }),
        };
        if got < head.len() {
            return Err(PcapError::ShortHeader { path, got });
        }
        let p = Self { src: Source::Classic(r), path, big_endian, nanos, offset: 24 };
        let linktype = p.word(&head, 20);
        if linktype != 1 {
            return Err(PcapError::LinkType { path: p.path, linktype });
        }
        Ok(p)
    }

    /// A pcapng stream whose first bytes, `head`, were read already.
    fn new_ng(r: R, path: String, head: Vec<u8>) -> Result<Self, PcapError> {
        let ng = PcapNgReader::new(io::Cursor::new(head).chain(r))
            .map_err(|e| PcapError::Ng { path: path.clone(), why: e.to_string() })?;
        Ok(Self { src: Source::Ng(Box::new(ng)), path, big_endian: false, nanos: true, offset: 0 })
    }

    /// The next frame of a pcapng stream: its Enhanced and Simple Packet
    /// Blocks, on an Ethernet interface, stamped in the interface's
    /// resolution; other blocks are read past.
    fn next_ng(&mut self) -> Result<Option<Frame>, PcapError> {
        let Source::Ng(ng) = &mut self.src else { return Ok(None) };
        let bad = |why: String| PcapError::Ng { path: self.path.clone(), why };
        loop {
            let block = match ng.next_block() {
                None => return Ok(None),
                Some(Err(e)) => return Err(bad(e.to_string())),
                Some(Ok(b)) => b,
            };
            let (interface, raw_t, orig, data) = match block {
                Block::EnhancedPacket(p) => {
                    (p.interface_id, p.timestamp.as_nanos(), p.original_len, p.data.into_owned())
                }
                Block::SimplePacket(p) => (0, 0, p.original_len, p.data.into_owned()),
                _ => continue,
            };
            let Some(idb) = ng.interfaces().get(interface as usize) else {
                return Err(bad(format!("a packet of interface {interface}, which no block described")));
            };
            if idb.linktype != pcap_file::DataLink::ETHERNET {
                return Err(PcapError::LinkType { path: self.path.clone(), linktype: u32::from(idb.linktype) });
            }
            // The crate reads a stamp as nanoseconds; it is in units of the
            // interface's resolution (microseconds unless it says).
            let resol = idb.options.iter().find_map(|o| match o {
                InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                _ => None,
            });
            let t_ns = stamp_ns(raw_t, resol.unwrap_or(6));
            let incl = u32::try_from(data.len()).unwrap_or(u32::MAX);
            if incl > MAX_FRAME || orig > MAX_FRAME {
                return Err(PcapError::BadLength { path: self.path.clone(), offset: 0, len: incl.max(orig) });
            }
            let mut data = data;
            data.resize(orig.max(incl) as usize, 0);
            return Ok(Some(Frame { t_ns, data }));
        }
    }

    fn word(&self, b: &[u8], i: usize) -> u32 {
        word_of(self.big_endian, b, i)
    }

    /// The next frame, `None` at the end of the file.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, PcapError> {
        let (big_endian, offset) = (self.big_endian, self.offset);
        let Source::Classic(r) = &mut self.src else { return self.next_ng() };
        let word = |b: &[u8], i: usize| word_of(big_endian, b, i);
        let read_err = |path: &str, source| PcapError::Read { path: path.to_owned(), source };
        let mut rec = [0u8; 16];
        match read_full(r, &mut rec).map_err(|e| read_err(&self.path, e))? {
            0 => return Ok(None),
            16 => {}
            _ => return Err(PcapError::Truncated { path: self.path.clone(), offset }),
        }
        let (sec, frac) = (u64::from(word(&rec, 0)), u64::from(word(&rec, 4)));
        let (incl, orig) = (word(&rec, 8), word(&rec, 12));
        if incl > MAX_FRAME || orig > MAX_FRAME {
            return Err(PcapError::BadLength { path: self.path.clone(), offset, len: incl.max(orig) });
        }
        let mut data = vec![0u8; incl as usize];
        if read_full(r, &mut data).map_err(|e| read_err(&self.path, e))? < data.len() {
            return Err(PcapError::Truncated { path: self.path.clone(), offset });
        }
        // Charged as sent: the bytes the capture left out are zeros.
        data.resize(orig.max(incl) as usize, 0);
        self.offset += 16 + u64::from(incl);
        let t_ns = sec * 1_000_000_000 + if self.nanos { frac } else { frac * 1_000 };
        Ok(Some(Frame { t_ns, data }))
    }
}

/// The 4 bytes of `b` at `i` in the capture's byte order.
fn word_of(big_endian: bool, b: &[u8], i: usize) -> u32 {
    let w = [b[i], b[i + 1], b[i + 2], b[i + 3]];
    if big_endian { u32::from_be_bytes(w) } else { u32::from_le_bytes(w) }
}

/// A pcapng stamp of `raw` units of resolution `resol` (its
/// `if_tsresol`: 10^-n, or 2^-n with the top bit set), in nanoseconds.
fn stamp_ns(raw: u128, resol: u8) -> u64 {
    let ns = if resol & 0x80 != 0 {
        let shift = u32::from(resol & 0x7f);
        if shift >= 64 { 0 } else { raw.saturating_mul(1_000_000_000) >> shift }
    } else {
        let n = u32::from(resol);
        if n <= 9 { raw.saturating_mul(10u128.pow(9 - n)) } else { raw / 10u128.pow((n - 9).min(38)) }
    };
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Read until `buf` is full or the stream ends; how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Verdict totals of one source prefix (or `non-ip` / `malformed`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixTotals {
    pub prefix: String,
    pub packets: u64,
    pub passed: u64,
    pub dropped: u64,
    pub shadow_dropped: u64,
}

/// What a replay found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub frames: u64,
    /// Frames stamped earlier than a frame before them in the file.
    pub reordered: u64,
    /// Of those, frames beyond the window: replayed at the latest time
    /// already replayed instead of their own.
    pub late: u64,
    pub prefixes: Vec<PrefixTotals>,
}

/// Frames put back in timestamp order within a bounded window.
#[derive(Default)]
struct InOrder {
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, Vec<u8>)>>,
    bytes: usize,
    seq: u64,
}

impl InOrder {
    fn push(&mut self, f: Frame) {
        self.bytes += f.data.len();
        self.seq += 1;
        self.heap.push(std::cmp::Reverse((f.t_ns, self.seq, f.data)));
    }

    /// The earliest frame held, once the window is full (or `all`).
    fn pop(&mut self, all: bool) -> Option<Frame> {
        if !all && self.heap.len() <= WINDOW_FRAMES && self.bytes <= WINDOW_BYTES {
            return None;
        }
        let std::cmp::Reverse((t_ns, _, data)) = self.heap.pop()?;
        self.bytes -= data.len();
        Some(Frame { t_ns, data })
    }
}

/// The source prefix a frame is charged to, by the policy's prefix
/// lengths: the program's own parser and key, run on the host.
fn prefix_of(parsed: &Result<packet::Source, Reason>, p: &Policy) -> String {
    match parsed {
        Ok(src) => crate::top::cidr(&bucket_key(src, p.v4_prefix, p.v6_prefix, 0)),
        Err(Reason::NonIp) => "non-ip".into(),
        Err(_) => "malformed".into(),
    }
}

/// Whether any part of `p` is in shadow mode (only then is a passed frame
/// checked for being a shadow drop).
fn has_shadow(p: &Policy) -> bool {
    p.default.mode == Mode::Shadow
        || p.classes.iter().any(|c| c.limit.mode == Mode::Shadow)
        || p.overrides.iter().any(|o| matches!(o.action, OverrideAction::Limit(l) if l.mode == Mode::Shadow))
}

/// One frame through the program at `now`, counted under its prefix.
/// With `shadow` (the compiled policy, when part of it is in shadow mode)
/// a passed frame is a shadow drop if the counter of its class and family
/// under `shadow_dropped` moved: the same parser and classifier as the
/// program's tell which, so one counter is read.
fn run_frame<'a>(
    l: &mut DataPlane,
    policy: &Policy,
    shadow: Option<&Config>,
    now: u64,
    data: &[u8],
    out: &'a mut BTreeMap<String, PrefixTotals>,
) -> anyhow::Result<&'a mut PrefixTotals> {
    let mut fam = limiter_common::family::NONE;
    let parsed = packet::parse(data, &mut fam);
    let prefix = prefix_of(&parsed, policy);
    let row = out.entry(prefix.clone()).or_insert_with(|| PrefixTotals { prefix, ..PrefixTotals::default() });
    row.packets += 1;
    // Only a classified frame can be a shadow drop.
    let slot = match (shadow, &parsed) {
        (Some(cfg), Ok(src)) => Some(stat_index(classify(cfg, src), Reason::ShadowDropped, fam)),
        _ => None,
    };
    let shadow_before = match slot {
        Some(i) => l.maps.counters.slot_packets(i)?,
        None => 0,
    };
    // The kernel refuses frames shorter than an Ethernet header.
    let Ok(action) = l.run_at(now, data) else {
        row.dropped += 1;
        return Ok(row);
    };
    if action == xdp_action::XDP_PASS {
        if let Some(i) = slot
            && l.maps.counters.slot_packets(i)? > shadow_before
        {
            row.shadow_dropped += 1;
        }
        row.passed += 1;
    } else {
        row.dropped += 1;
    }
    Ok(row)
}

/// Replay the frames of `pcap` through a private copy of the program
/// under `policy`.
pub fn replay<R: Read>(policy: &Policy, pcap: &mut Pcap<R>) -> anyhow::Result<Report> {
    // The injected clock starts one second in (time 0 is not special, but
    // a bucket should never look created before the clock started) and
    // runs with the capture's timestamps; window quotas see the capture's
    // own time (the offset below), so their slices fall where the live
    // program's would have at those times.
    const BASE_NS: u64 = 1_000_000_000;
    let compiled = policy.compile(1)?;
    let mut l = DataPlane::open(policy.capacity)?;
    l.maps.apply(&compiled)?;
    let shadow = has_shadow(policy).then_some(&compiled.config);
    let mut out: BTreeMap<String, PrefixTotals> = BTreeMap::new();
    let mut report = Report::default();
    let (mut window, mut newest) = (InOrder::default(), 0);
    let (mut first, mut now) = (None, BASE_NS);
    let mut more = true;
    while more {
        match pcap.next_frame()? {
            Some(f) => {
                report.frames += 1;
                if f.t_ns < newest {
                    report.reordered += 1;
                }
                newest = newest.max(f.t_ns);
                window.push(f);
            }
            None => more = false,
        }
        while let Some(f) = window.pop(!more) {
            let t0 = *first.get_or_insert_with(|| {
                // Window quotas number slices on the capture's own clock,
                // as the live program does on the wall clock.
                let _ = l.set_wall_offset(f.t_ns.wrapping_sub(BASE_NS));
                f.t_ns
            });
            let t = BASE_NS + f.t_ns.saturating_sub(t0);
            if t < now {
                report.late += 1;
            }
            now = now.max(t);
            run_frame(&mut l, policy, shadow, now, &f.data, &mut out)?;
        }
    }
    let mut rows: Vec<PrefixTotals> = out.into_values().collect();
    rows.sort_by(|a, b| b.dropped.cmp(&a.dropped).then(b.packets.cmp(&a.packets)).then(a.prefix.cmp(&b.prefix)));
    report.prefixes = rows;
    Ok(report)
}

#[cfg(test)]
mod tests;
