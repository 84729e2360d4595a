//! `limiter replay`: run the real XDP program over a capture, offline, with
//! the capture's own timestamps fed through the injected clock, and total
//! the verdicts per source prefix. Nothing is attached to any interface.

use std::{collections::BTreeMap, path::Path};

use limiter_common::{Reason, packet, rules::bucket_key};
use serde::Serialize;

use crate::{
    dataplane::{DataPlane, xdp_action},
    policy::Policy,
};

/// One frame of a capture.
pub struct Frame {
    /// Nanoseconds since the first frame.
    pub t_ns: u64,
    pub data: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a pcap file (magic {magic:#010x}; pcapng is not supported, convert with `editcap -F pcap`)")]
    Magic { path: String, magic: u32 },
    #[error("{path}: link type {0} is not Ethernet (1)", .linktype)]
    LinkType { path: String, linktype: u32 },
    #[error("{path}: record at byte {offset} is cut short")]
    Truncated { path: String, offset: usize },
}

/// Read a classic pcap file (either byte order, micro- or nanosecond
/// timestamps, Ethernet link type).
pub fn read_pcap(path: &Path) -> Result<Vec<Frame>, PcapError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| PcapError::Read { path: name.clone(), source })?;
    let truncated = |offset| PcapError::Truncated { path: name.clone(), offset };
    let magic_le = bytes.get(..4).map_or(0, |m| u32::from_le_bytes(m.try_into().expect("4 bytes")));
    let (big, nanos) = match magic_le {
        0xa1b2_c3d4 => (false, false),
        0xa1b2_3c4d => (false, true),
        0xd4c3_b2a1 => (true, false),
        0x4d3c_b2a1 => (true, true),
        magic => return Err(PcapError::Magic { path: name, magic }),
    };
    let head = bytes.get(..24).ok_or_else(|| truncated(0))?;
    let u32_at = |b: &[u8], i: usize| {
        let w: [u8; 4] = b[i..i + 4].try_into().expect("4 bytes");
        if big { u32::from_be_bytes(w) } else { u32::from_le_bytes(w) }
    };
    let linktype = u32_at(head, 20);
    if linktype != 1 {
        return Err(PcapError::LinkType { path: name, linktype });
    }
    let mut frames = Vec::new();
    let (mut off, mut first) = (24, None);
    while off < bytes.len() {
        let rec = bytes.get(off..off + 16).ok_or_else(|| truncated(off))?;
        let (sec, frac, len) = (u64::from(u32_at(rec, 0)), u64::from(u32_at(rec, 4)), u32_at(rec, 8) as usize);
        let data = bytes.get(off + 16..off + 16 + len).ok_or_else(|| truncated(off))?.to_vec();
        let t = sec * 1_000_000_000 + if nanos { frac } else { frac * 1_000 };
        let t0 = *first.get_or_insert(t);
        frames.push(Frame { t_ns: t.saturating_sub(t0), data });
        off += 16 + len;
    }
    Ok(frames)
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

/// The source prefix a frame is charged to, by the policy's prefix
/// lengths: the program's own parser and key, run on the host.
fn prefix_of(data: &[u8], p: &Policy) -> String {
    let mut fam = 0;
    match packet::parse(data, &mut fam) {
        Ok(src) => crate::top::cidr(&bucket_key(&src, p.v4_prefix, p.v6_prefix, 0)),
        Err(Reason::NonIp) => "non-ip".into(),
        Err(_) => "malformed".into(),
    }
}

/// Replay `frames` through a private copy of the program under `policy`.
pub fn replay(policy: &Policy, frames: &[Frame]) -> anyhow::Result<Vec<PrefixTotals>> {
    // Timestamps start one second in: time 0 is not special, but a bucket
    // should never look created before the clock started.
    const BASE_NS: u64 = 1_000_000_000;
    let compiled = policy.compile(1)?;
    let mut l = DataPlane::open(policy.capacity)?;
    l.maps.apply(&compiled)?;
    let mut out: BTreeMap<String, PrefixTotals> = BTreeMap::new();
    for f in frames {
        let prefix = prefix_of(&f.data, policy);
        let row = out.entry(prefix.clone()).or_insert_with(|| PrefixTotals { prefix, ..PrefixTotals::default() });
        row.packets += 1;
        let shadow_before = l.maps.totals()?.get(Reason::ShadowDropped).packets;
        // The kernel refuses frames shorter than an Ethernet header.
        let Ok(action) = l.run_at(BASE_NS + f.t_ns, &f.data) else {
            row.dropped += 1;
            continue;
        };
        if action == xdp_action::XDP_PASS {
            if l.maps.totals()?.get(Reason::ShadowDropped).packets > shadow_before {
                row.shadow_dropped += 1;
            }
            row.passed += 1;
        } else {
            row.dropped += 1;
        }
    }
    let mut rows: Vec<PrefixTotals> = out.into_values().collect();
    rows.sort_by(|a, b| b.dropped.cmp(&a.dropped).then(b.packets.cmp(&a.packets)).then(a.prefix.cmp(&b.prefix)));
    Ok(rows)
}
