//! The daemon's side of capture: it drains the frames the program copied
//! (with the sampled drops, every 200 ms), hands them to the taps of
//! `limiter capture` and to every feature (the attacks' pcaps), and
//! keeps `CAPTURE` switched on exactly while one of them wants dropped
//! frames, and the program's `LIMITER_PASSES` while one wants passed
//! frames (one in a power of two, set from the last second's passes so
//! that no more a second are copied than the most any asks).

use std::time::Instant;

use limiter_common::capture::CaptureCtl;

use super::features::Features;
use crate::capture::{Frame, ctl, passes_one_in, taps::Taps};
use crate::control::{Captured, ErrorCode, Request, Response, WireFrame};
use crate::dataplane::Capture;

/// Frames drained at most at once (the ring holds about 14,000).
const MAX_DRAIN: usize = 16_384;

pub(super) struct Capturing {
    ring: Option<Capture>,
    taps: Taps,
    /// What `CAPTURE` holds.
    written: CaptureCtl,
    /// What `LIMITER_PASSES` holds.
    passes: u32,
    /// Packets passed in the last second, and the program's count of
    /// passes at its end.
    passed: (u64, Option<u64>),
    /// That, said for `limiter status`.
    said: String,
}

impl Capturing {
    pub(super) fn new(ring: Option<Capture>) -> Self {
        let said = if ring.is_some() { "off" } else { "unavailable (no capture ring)" }.to_owned();
        Self { ring, taps: Taps::default(), written: CaptureCtl::default(), passes: 0, passed: (0, None), said }
    }

    /// A second ended, the program having counted `totals` so far.
    pub(super) fn second(&mut self, totals: &crate::dataplane::Totals) {
        let now = totals.of(limiter_common::Action::Pass).packets;
        let last = self.passed.1.replace(now);
        self.passed.0 = last.map_or(0, |l| now.saturating_sub(l));
    }

    /// Hand the frames copied since the last drain on, then switch
    /// `CAPTURE` to what is wanted now.
    pub(super) fn drain(&mut self, features: &mut Features, class_names: &[String]) {
        let now = Instant::now();
        self.taps.expire(now);
        let Some(ring) = &mut self.ring else { return };
        let mut frames = Vec::new();
        let mut offset = None;
        while frames.len() < MAX_DRAIN {
            let Some(item) = ring.frames.next() else { break };
            let offset = *offset.get_or_insert_with(crate::capture::clock_offset);
            frames.extend(Frame::decode(&item, offset));
        }
        if !frames.is_empty() {
            self.taps.offer(&frames, class_names);
            features.frames(&frames, class_names);
        }
        let by_features = features.wants_frames();
        let passes = features.wants_passes();
        let attack = !by_features.is_empty() || !passes.is_empty();
        self.switch(ctl(by_features.into_iter().chain(self.taps.want())));
        self.switch_passes(passes_one_in(passes.into_iter().chain(self.taps.want_passes()), self.passed.0));
        if self.ring.is_some() {
            let drops = match self.written.one_in {
                0 => None,
                n => Some(format!("one drop in {n} copied")),
            };
            let passes = match self.passes {
                0 => None,
                n => Some(format!("one pass in {n} copied")),
            };
            let copied: Vec<String> = drops.into_iter().chain(passes).collect();
            self.said = if copied.is_empty() {
                "off".to_owned()
            } else {
                format!(
                    "on: {}, for {} live capture(s){}",
                    copied.join(", "),
                    self.taps.len(),
                    if attack { " and the attack's record" } else { "" }
                )
            };
        }
    }

    fn switch_passes(&mut self, one_in: u32) {
        if one_in == self.passes {
            return;
        }
        let Some(ring) = &mut self.ring else { return };
        match ring.passes.set(0, one_in, 0) {
            Ok(()) => {
                tracing::debug!(
                    "limiter: capture of passes {}",
                    if one_in == 0 { "off".to_owned() } else { format!("on, one in {one_in}") }
                );
                self.passes = one_in;
            }
            Err(e) => tracing::warn!("limiter: switching the capture of passes: {e}"),
        }
    }

    /// Copy nothing more (the daemon stops; a pinned program goes on).
    pub(super) fn off(&mut self) {
        self.switch(CaptureCtl::default());
        self.switch_passes(0);
    }

    /// What it copies now, said.
    pub(super) fn described(&self) -> &str {
        &self.said
    }

    fn switch(&mut self, want: CaptureCtl) {
        if want == self.written {
            return;
        }
        let Some(ring) = &mut self.ring else { return };
        match ring.ctl.set(0, want, 0) {
            Ok(()) => {
                tracing::debug!(
                    "limiter: capture {}",
                    if want.one_in == 0 { "off".to_owned() } else { format!("on, one in {}", want.one_in) }
                );
                self.written = want;
            }
            Err(e) => tracing::warn!("limiter: switching capture: {e}"),
        }
    }

    /// The answer to a capture request (`None`: not one).
    pub(super) fn answer(&mut self, req: &Request, class_names: &[String]) -> Option<Response> {
        let now = Instant::now();
        let captured = |id, frames: Vec<Frame>, lost| {
            Response::Captured(Captured {
                id,
                frames: frames.iter().map(WireFrame::of).collect(),
                lost,
                class_names: class_names.to_vec(),
            })
        };
        Some(match req {
            Request::CaptureOpen { .. } | Request::CaptureRead { .. } if self.ring.is_none() => {
                Response::error(ErrorCode::Unavailable, "this data plane has no capture ring".to_owned())
            }
            Request::CaptureOpen { filter } => match self.taps.open(filter.clone(), class_names, now) {
                Ok(id) => captured(id, Vec::new(), 0),
                Err(e) => Response::error(ErrorCode::Refused, e.to_string()),
            },
            Request::CaptureRead { id } => match self.taps.read(*id, now) {
                Ok((frames, lost)) => captured(*id, frames, lost),
                Err(e) => Response::error(ErrorCode::Refused, e.to_string()),
            },
            Request::CaptureClose { id } => {
                if self.taps.close(*id) {
                    captured(*id, Vec::new(), 0)
                } else {
                    Response::error(ErrorCode::Refused, format!("no capture {id} is open"))
                }
            }
            _ => return None,
        })
    }
}
