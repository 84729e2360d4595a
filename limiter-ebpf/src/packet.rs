//! The packet under XDP, read and written with bounds checks the verifier
//! accepts: the bottom of the program, imported by the rest.

use aya_ebpf::programs::XdpContext;
use limiter_common::packet::Frame;

/// The packet as a [`Frame`] for the shared parser.
pub struct Packet<'a>(pub &'a XdpContext);

impl Packet<'_> {
    /// Frame length in bytes (what a byte-cost class charges).
    #[inline(always)]
    pub fn len(&self) -> u64 {
        (self.0.data_end() - self.0.data()) as u64
    }

    /// Write `N` bytes at `off`, if they lie inside the packet.
    #[cfg_attr(feature = "without-syn-cookies", expect(dead_code, reason = "SYN cookies only"))]
    #[inline(always)]
    pub fn put<const N: usize>(&self, off: usize, bytes: &[u8; N]) -> Option<()> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: the N bytes at start + off are inside the packet.
        unsafe { *((start + off) as *mut [u8; N]) = *bytes };
        Some(())
    }

    /// The `N` bytes at `off` to write, if they lie inside the packet.
    #[expect(clippy::mut_from_ref, reason = "the packet's bytes, not the context's")]
    #[inline(always)]
    pub fn bytes_mut<const N: usize>(&self, off: usize) -> Option<&mut [u8; N]> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: the N bytes at start + off are inside the packet, and
        // the program holds no other reference to them.
        Some(unsafe { &mut *((start + off) as *mut [u8; N]) })
    }

    /// The offset of the IP header behind up to two VLAN tags, as the
    /// parser found it (14, 18 or 22).
    #[inline(always)]
    pub fn l3(&self) -> Option<usize> {
        let tag = |et: [u8; 2]| et == [0x81, 0x00] || et == [0x88, 0xa8];
        if !tag(*self.bytes_at::<2>(12)?) {
            return Some(14);
        }
        Some(if tag(*self.bytes_at::<2>(16)?) { 22 } else { 18 })
    }
}

impl Frame for Packet<'_> {
    #[inline(always)]
    fn bytes_at<const N: usize>(&self, off: usize) -> Option<&[u8; N]> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: the N bytes at start + off are inside the packet.
        Some(unsafe { &*((start + off) as *const [u8; N]) })
    }

    #[inline(always)]
    fn holds(&self, off: usize, len: usize) -> bool {
        self.0.data() + off + len <= self.0.data_end()
    }
}
