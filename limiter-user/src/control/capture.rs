//! `limiter capture` over the control socket: a tap is opened, read a
//! batch at a time (each frame's bytes in hex), and closed.

use serde::{Deserialize, Serialize};

use crate::capture::Frame;

/// One frame as the control socket carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFrame {
    /// Nanoseconds since the Unix epoch.
    pub t_ns: u64,
    /// Length on the wire.
    pub len: u32,
    /// The bytes copied, in hex.
    pub data: String,
    /// The reason's index.
    pub reason: u32,
    pub class: u8,
    /// Copied as one in this many of its kind (1: every one).
    #[serde(default = "one")]
    pub one_in: u32,
}

const fn one() -> u32 {
    1
}

impl WireFrame {
    #[must_use]
    pub fn of(f: &Frame) -> Self {
        use std::fmt::Write as _;
        let mut data = String::with_capacity(f.data.len() * 2);
        for b in &f.data {
            let _ = write!(data, "{b:02x}");
        }
        Self { t_ns: f.t_ns, len: f.len, data, reason: f.reason as u32, class: f.class, one_in: f.one_in }
    }

    /// The frame back; `None` for what no daemon sends.
    #[must_use]
    pub fn frame(&self) -> Option<Frame> {
        let hex = self.data.as_bytes();
        if !hex.len().is_multiple_of(2) || hex.len() > 2 * limiter_common::capture::SNAP {
            return None;
        }
        let data = hex
            .chunks(2)
            .map(|c| std::str::from_utf8(c).ok().and_then(|s| u8::from_str_radix(s, 16).ok()))
            .collect::<Option<Vec<u8>>>()?;
        Some(Frame {
            t_ns: self.t_ns,
            len: self.len,
            data,
            reason: limiter_common::Reason::from_index(self.reason)?,
            class: self.class,
            one_in: self.one_in.max(1),
        })
    }
}

/// A batch of a tap's frames.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// The tap's id (to read it again, and to close it).
    pub id: u64,
    pub frames: Vec<WireFrame>,
    /// Frames the tap lost since the last read (its client read slower
    /// than they came).
    pub lost: u64,
    /// The policy's class names, by index.
    pub class_names: Vec<String>,
}
