use std::time::{Duration, Instant};

use limiter_common::capture::{CaptureHead, SNAP};

use super::{Filter, Frame, Want, ctl, passes_one_in, taps::*};
use limiter_common::Reason;

/// An Ethernet + IPv4 + UDP frame from `src` to port 7001.
fn udp_from(src: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&28u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&src);
    f[30..34].copy_from_slice(&[198, 18, 0, 2]);
    f[34..36].copy_from_slice(&12345u16.to_be_bytes());
    f[36..38].copy_from_slice(&7001u16.to_be_bytes());
    f[38..40].copy_from_slice(&8u16.to_be_bytes());
    f
}

fn frame(src: [u8; 4], reason: Reason) -> Frame {
    Frame { t_ns: 1_700_000_000_123_456_789, len: 42, data: udp_from(src), reason, class: 1, one_in: 1 }
}

/// A record of `CAPTURES` as the program writes it.
fn record(t: u64, len: u32, data: &[u8], reason: u32, class: u32) -> Vec<u8> {
    let caplen = u32::try_from(data.len()).unwrap();
    let head = CaptureHead { t_ns: t, len, caplen, reason, class, one_in: 16, pad: 0 };
    let mut r = Vec::new();
    r.extend_from_slice(&head.t_ns.to_ne_bytes());
    for w in [head.len, head.caplen, head.reason, head.class, head.one_in, head.pad] {
        r.extend_from_slice(&w.to_ne_bytes());
    }
    r.extend_from_slice(data);
    r.resize(size_of::<CaptureHead>() + SNAP, 0);
    r
}

#[test]
fn a_record_decodes_with_its_stamp_on_the_wall_clock_and_bad_ones_do_not() {
    let data = udp_from([198, 18, 41, 7]);
    let r = record(5_000, 1_500, &data, Reason::RateLimited as u32, 1);
    let f = Frame::decode(&r, 1_000_000).unwrap();
    assert_eq!(
        (f.t_ns, f.len, f.data.as_slice(), f.reason, f.class, f.one_in),
        (1_005_000, 1_500, &data[..], Reason::RateLimited, 1, 16)
    );
    assert_eq!(f.source_ip(), Some("198.18.41.7".parse().unwrap()));
    assert!(Frame::decode(&r[..20], 0).is_none(), "cut short");
    assert!(Frame::decode(&record(1, 60, &[], 1, 0), 0).is_none(), "no bytes");
    assert!(Frame::decode(&record(1, 60, &data, 999, 0), 0).is_none(), "no such reason");
    let mut long = record(1, 60, &data, 1, 0);
    long[12..16].copy_from_slice(&(u32::try_from(SNAP).unwrap() + 1).to_ne_bytes());
    assert!(Frame::decode(&long, 0).is_none(), "more than SNAP bytes claimed");
}

#[test]
fn the_switch_is_off_without_wanters_and_takes_the_densest_draw() {
    assert_eq!(ctl([]).one_in, 0);
    assert_eq!(ctl([Want::OneIn(100)]).one_in, 128);
    assert_eq!(ctl([Want::OneIn(100), Want::OneIn(3)]).one_in, 4);
    assert_eq!(ctl([Want::OneIn(64), Want::Every]).one_in, 1);
    assert_eq!(ctl([Want::OneIn(0)]).one_in, 1);
}

#[test]
fn a_filter_takes_by_reason_prefix_and_class_and_refuses_unknown_words() {
    let names = vec!["default".to_owned(), "web".to_owned()];
    let f = frame([198, 18, 41, 7], Reason::RateLimited);
    assert!(Filter::default().takes(&f, &names));
    let by_reason = Filter { reason: Some("rate_limited".into()), ..Filter::default() };
    assert!(by_reason.takes(&f, &names));
    assert!(!by_reason.takes(&frame([198, 18, 41, 7], Reason::Denied), &names));
    let by_prefix = Filter { prefix: Some("198.18.41.0/24".parse().unwrap()), ..Filter::default() };
    assert!(by_prefix.takes(&f, &names));
    assert!(!by_prefix.takes(&frame([198, 18, 42, 7], Reason::RateLimited), &names));
    assert!(Filter { class: Some("web".into()), ..Filter::default() }.takes(&f, &names));
    assert!(!Filter { class: Some("default".into()), ..Filter::default() }.takes(&f, &names));
    assert!(Filter { reason: Some("rate_limted".into()), ..Filter::default() }.check(&names).is_err());
    assert!(Filter { class: Some("mail".into()), ..Filter::default() }.check(&names).is_err());
    assert!(by_reason.check(&names).is_ok());
}

#[test]
fn a_filter_takes_drops_or_passes_never_both_and_says_which_a_reason_is() {
    let names = vec!["default".to_owned()];
    let (dropped, passed) = (frame([198, 18, 41, 7], Reason::RateLimited), frame([198, 18, 41, 7], Reason::Admitted));
    // A would-be drop of shadow mode passes, but is shown with the drops.
    let shadow = frame([198, 18, 41, 7], Reason::ShadowDropped);
    let of_passes = Filter { passed: true, ..Filter::default() };
    assert!(Filter::default().takes(&dropped, &names) && Filter::default().takes(&shadow, &names));
    assert!(!Filter::default().takes(&passed, &names));
    assert!(
        of_passes.takes(&passed, &names) && !of_passes.takes(&dropped, &names) && !of_passes.takes(&shadow, &names)
    );
    let admitted = Some("admitted".to_owned());
    let e = Filter { reason: admitted.clone(), ..Filter::default() }.check(&names).unwrap_err();
    assert!(e.contains("--passed"), "{e}");
    assert!(Filter { reason: admitted, passed: true, ..Filter::default() }.check(&names).is_ok());
    let limited = Filter { reason: Some("rate_limited".into()), passed: true, ..Filter::default() };
    assert!(limited.check(&names).is_err());
}

#[test]
fn passes_are_drawn_one_in_a_power_of_two_that_copies_no_more_than_the_most_asked() {
    assert_eq!(passes_one_in([], 1_000_000), 0, "nobody asks");
    assert_eq!(passes_one_in([1_000], 0), 1, "no passes seen yet: every one until a second says");
    assert_eq!(passes_one_in([1_000], 900), 1);
    assert_eq!(passes_one_in([1_000], 1_001), 2);
    // 1,000,000 a second for at most 10,000: one in 128 (7,812 a second).
    assert_eq!(passes_one_in([1_000, 10_000], 1_000_000), 128);
    assert_eq!(passes_one_in([1], u64::MAX), 1 << 31);
}

#[test]
fn taps_of_passes_ask_for_passes_and_not_for_drops() {
    let (names, t0) = (vec!["default".to_owned()], Instant::now());
    let mut taps = Taps::default();
    let id = taps.open(Filter { passed: true, ..Filter::default() }, &names, t0).unwrap();
    assert_eq!((taps.want(), taps.want_passes()), (None, Some(PASSES_PER_SECOND)));
    taps.open(Filter::default(), &names, t0).unwrap();
    assert_eq!(taps.want(), Some(Want::Every));
    taps.close(id);
    assert_eq!(taps.want_passes(), None);
}

#[test]
fn taps_are_bounded_in_number_queue_and_idle_time() {
    let (names, t0) = (vec!["default".to_owned()], Instant::now());
    let mut taps = Taps::default();
    assert_eq!(taps.want(), None);
    let ids: Vec<u64> = (0..MAX_TAPS).map(|_| taps.open(Filter::default(), &names, t0).unwrap()).collect();
    assert_eq!(taps.open(Filter::default(), &names, t0), Err(TapError::Full));
    assert_eq!(taps.want(), Some(Want::Every));
    let frames = vec![frame([198, 18, 41, 7], Reason::RateLimited); QUEUE + 10];
    taps.offer(&frames, &names);
    let (got, lost) = taps.read(ids[0], t0).unwrap();
    assert_eq!((got.len(), lost), (BATCH, 10), "the oldest lost past the queue, counted once");
    assert_eq!(taps.read(ids[0], t0).unwrap().1, 0);
    // Read at IDLE - 1 s, the first stays; the others were never read.
    let later = t0 + IDLE.saturating_sub(Duration::from_secs(1));
    taps.read(ids[0], later).unwrap();
    taps.expire(t0 + IDLE + Duration::from_millis(1));
    assert_eq!(taps.len(), 1);
    assert_eq!(taps.read(ids[1], later), Err(TapError::Unknown(ids[1])));
    assert!(taps.close(ids[0]) && taps.is_empty() && taps.want().is_none());
}
