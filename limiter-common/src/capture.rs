//! Packet capture at the driver: the frames the program drops (and, when
//! asked, a random sample of those it passes), copied whole up to
//! [`SNAP`] bytes into their own ring buffer for `limiter capture` and
//! each attack's pcap. Off, it costs the drop path one array read and the
//! admit path one load of a global; the main program decides only
//! whether to call the global function that copies and submits.

/// Bytes of a frame copied at most (headers and the start of a payload).
pub const SNAP: usize = 256;

/// The one entry of `CAPTURE`, written by userspace while a capture or an
/// attack's pcap wants frames. All zero: no capture (the data plane's
/// drop sample is then drawn as without this map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureCtl {
    /// A drop is copied when its random draw falls in one in this many
    /// (a power of two); 0: capture is off.
    pub one_in: u32,
    /// Always zero (explicit padding; passed frames are asked for by the
    /// program's global `LIMITER_PASSES`, see `maps::GLOBALS`).
    pub pad: [u32; 3],
}

/// What precedes a frame's bytes in `CAPTURES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureHead {
    /// `CLOCK_MONOTONIC` at the copy, in nanoseconds.
    pub t_ns: u64,
    /// The frame's length on the wire (its linear part).
    pub len: u32,
    /// Bytes copied, `1..=SNAP`.
    pub caplen: u32,
    /// The [`crate::Reason`] as its index.
    pub reason: u32,
    /// The rule class.
    pub class: u32,
    /// It was copied as one in this many of its kind (drops, or passes)
    /// drawn at random: 1 while every one is.
    pub one_in: u32,
    /// Always zero (explicit padding).
    pub pad: u32,
}

/// One record of `CAPTURES`: the head and up to [`SNAP`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureRecord {
    pub head: CaptureHead,
    pub data: [u8; SNAP],
}
