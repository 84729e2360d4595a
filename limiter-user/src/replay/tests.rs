use super::*;

fn file(records: &[(u32, u32, u32, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for w in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65_535, 1] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    for (sec, incl, orig, data) in records {
        for w in [*sec, 0, *incl, *orig] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(data);
    }
    b
}

#[test]
fn a_cut_frame_is_padded_to_its_original_length() {
    let b = file(&[(1, 4, 1500, &[1, 2, 3, 4])]);
    let mut p = Pcap::new(b.as_slice(), "t".into()).unwrap();
    let f = p.next_frame().unwrap().unwrap();
    assert_eq!((f.t_ns, f.data.len(), &f.data[..5]), (1_000_000_000, 1500, &[1, 2, 3, 4, 0][..]));
    assert!(p.next_frame().unwrap().is_none());
}

#[test]
fn the_header_is_checked_before_anything_else_is_read() {
    // A reader that fails after the header: a bad magic is found first.
    struct Header(Vec<u8>);
    impl Read for Header {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::other("read past the header"));
            }
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }
    let e = Pcap::new(Header(vec![7; 24]), "t".into()).err().unwrap();
    assert!(matches!(e, PcapError::Magic { magic: 0x0707_0707, .. }), "{e}");
}

#[test]
fn the_window_puts_frames_back_in_order_and_stays_bounded() {
    let mut w = InOrder::default();
    for t in [5, 1, 3] {
        w.push(Frame { t_ns: t, data: vec![0; 10] });
    }
    assert!(w.pop(false).is_none(), "held while the window has room");
    let order: Vec<u64> = std::iter::from_fn(|| w.pop(true)).map(|f| f.t_ns).collect();
    assert_eq!(order, [1, 3, 5]);
    for t in 0..=WINDOW_FRAMES as u64 {
        w.push(Frame { t_ns: t, data: Vec::new() });
    }
    assert_eq!(w.pop(false).map(|f| f.t_ns), Some(0), "a full window gives up its earliest");
    w.push(Frame { t_ns: 1, data: vec![0; WINDOW_BYTES + 1] });
    assert!(w.pop(false).is_some(), "too many bytes held: one goes");
}

#[test]
fn hostile_lengths_and_cut_records_are_refused() {
    let b = file(&[(1, 4, MAX_FRAME + 1, &[1, 2, 3, 4])]);
    assert!(matches!(Pcap::new(b.as_slice(), "t".into()).unwrap().next_frame(), Err(PcapError::BadLength { .. })));
    let mut b = file(&[(1, 8, 8, &[1, 2, 3, 4, 5, 6, 7, 8])]);
    b.truncate(b.len() - 3);
    let e = Pcap::new(b.as_slice(), "t".into()).unwrap().next_frame().err().unwrap();
    assert!(matches!(e, PcapError::Truncated { offset: 24, .. }), "{e}");
}

#[test]
fn an_empty_or_short_capture_says_what_it_is() {
    let e = Pcap::new(&[][..], "empty.pcap".into()).err().unwrap();
    assert_eq!(e.to_string(), "empty.pcap: empty, no pcap header (a capture holds at least its 24-byte header)");
    let head = file(&[]);
    let e = Pcap::new(&head[..10], "cut.pcap".into()).err().unwrap();
    assert!(e.to_string().contains("10 bytes, shorter than a pcap header"), "{e}");
}

#[test]
fn pcapng_stamps_are_read_in_their_interface_resolution() {
    assert_eq!(stamp_ns(1_500_000, 6), 1_500_000_000, "microseconds, pcapng's default");
    assert_eq!(stamp_ns(1_500_000_123, 9), 1_500_000_123);
    assert_eq!(stamp_ns(3, 0), 3_000_000_000);
    assert_eq!(stamp_ns(1 << 10, 0x80 | 0x0a), 1_000_000_000, "2^-10 s units");
    assert_eq!(stamp_ns(12_000, 12), 12);
}

#[test]
fn pcapng_of_a_capture_is_read_back_with_stamps_in_nanoseconds() {
    use crate::capture::{Frame as Copied, pcapng};
    use limiter_common::Reason;
    let names = vec!["default".to_owned(), "web".to_owned()];
    let frame = |src: [u8; 4], reason| {
        let mut data = vec![0u8; 42];
        data[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        data[14] = 0x45;
        data[26..30].copy_from_slice(&src);
        Copied { t_ns: 1_700_000_000_123_456_789, len: 42, data, reason, class: 1, one_in: 1 }
    };
    let mut writer = pcapng::Writer::new(Vec::new()).unwrap();
    let frames = [frame([198, 18, 41, 7], Reason::RateLimited), frame([198, 18, 44, 1], Reason::Denied)];
    for f in &frames {
        writer.write(f, &names).unwrap();
    }
    assert_eq!(pcapng::comment(&frames[1], &names), "verdict=drop reason=denied class=web");
    let bytes = writer.into_inner();
    let mut pcap = Pcap::new(bytes.as_slice(), "t".into()).unwrap();
    for want in &frames {
        let got = pcap.next_frame().unwrap().unwrap();
        assert_eq!((got.t_ns, got.data.as_slice()), (want.t_ns, &want.data[..]));
    }
    assert!(pcap.next_frame().unwrap().is_none());
}
