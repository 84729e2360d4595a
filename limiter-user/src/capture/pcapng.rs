//! Captured frames as pcapng: one Ethernet interface (nanosecond stamps,
//! snap length [`SNAP`]), and each frame's verdict, reason and class in
//! its comment (`verdict=drop reason=rate_limited class=web`), which
//! `tshark -T fields -e frame.comment` prints and `tcpdump -r` reads past.

use std::{borrow::Cow, io::Write, time::Duration};

use limiter_common::capture::SNAP;
use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};

use super::{Frame, class_name};

/// A pcapng stream being written.
pub struct Writer<W: Write> {
    w: PcapNgWriter<W>,
    /// Bytes written so far.
    pub bytes: u64,
    /// Frames written so far.
    pub frames: u64,
}

impl<W: Write> Writer<W> {
    /// The section and interface headers, written at once.
    pub fn new(w: W) -> std::io::Result<Self> {
        let mut w = PcapNgWriter::new(w).map_err(std::io::Error::other)?;
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            #[expect(clippy::cast_possible_truncation, reason = "SNAP is 256")]
            snaplen: SNAP as u32,
            // Stamps are written in nanoseconds (pcap-file's unit).
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        };
        let bytes = w.write_pcapng_block(idb).map_err(std::io::Error::other)?;
        Ok(Self { w, bytes: bytes as u64 + 28, frames: 0 })
    }

    /// One frame, with its comment.
    pub fn write(&mut self, f: &Frame, class_names: &[String]) -> std::io::Result<()> {
        let comment = comment(f, class_names);
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(f.t_ns),
            original_len: f.len,
            data: Cow::Borrowed(&f.data),
            options: vec![EnhancedPacketOption::Comment(Cow::Owned(comment))],
        };
        let n = self.w.write_pcapng_block(epb).map_err(std::io::Error::other)?;
        self.bytes += n as u64;
        self.frames += 1;
        Ok(())
    }

    /// The stream written, flushed.
    pub fn into_inner(self) -> W {
        self.w.into_inner()
    }

    /// Flush what is buffered.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.w.get_mut().flush()
    }
}

/// A frame's comment: `verdict=drop reason=rate_limited class=web`, and
/// `sample=1/64` after it when the frame was drawn as one in 64.
#[must_use]
pub fn comment(f: &Frame, class_names: &[String]) -> String {
    let sample = if f.one_in > 1 { format!(" sample=1/{}", f.one_in) } else { String::new() };
    format!(
        "verdict={} reason={} class={}{sample}",
        f.reason.verdict().label(),
        f.reason.label(),
        class_name(class_names, f.class)
    )
}
