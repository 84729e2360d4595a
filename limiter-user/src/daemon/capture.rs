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
    /// What `CAPTURE` holds (one drop in N copied; 0: none).
    drops: u32,
    /// What `LIMITER_PASSES` holds (one pass in N).
    passes: u32,
    /// Packets passed in the last second.
    passed: u64,
    /// That, said for `limiter status`.
    said: String,
}

impl Capturing {
    pub(super) fn new(ring: Option<Capture>) -> Self {
        let said = if ring.is_some() { "off" } else { "unavailable (no capture ring)" }.to_owned();
        Self { ring, taps: Taps::default(), drops: 0, passes: 0, passed: 0, said }
    }

    /// A second ended in which the program counted `delta`.
    pub(super) fn second(&mut self, delta: &crate::dataplane::Totals) {
        self.passed = delta.of(limiter_common::Action::Pass).packets;
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
        let drops = ctl(by_features.into_iter().chain(self.taps.want())).one_in;
        self.switch(drops, passes_one_in(passes.into_iter().chain(self.taps.want_passes()), self.passed));
        if self.ring.is_some() {
            let copied: Vec<String> = [("drop", self.drops), ("pass", self.passes)]
                .into_iter()
                .filter(|(_, n)| *n != 0)
                .map(|(what, n)| format!("one {what} in {n} copied"))
                .collect();
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

    /// Copy nothing more (the daemon stops; a pinned program goes on).
    pub(super) fn off(&mut self) {
        self.switch(0, 0);
    }

    /// What it copies now, said.
    pub(super) fn described(&self) -> &str {
        &self.said
    }

    /// Copy one drop in `drops` and one pass in `passes` (0: none),
    /// writing only what changed.
    fn switch(&mut self, drops: u32, passes: u32) {
        let Some(ring) = &mut self.ring else { return };
        let ctl = CaptureCtl { one_in: drops, ..CaptureCtl::default() };
        set_one_in(&mut self.drops, drops, "drops", || ring.ctl.set(0, ctl, 0));
        set_one_in(&mut self.passes, passes, "passes", || ring.passes.set(0, passes, 0));
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

/// `*held = want` once `write` has put it in the data plane (a failure
/// logged, and tried again at the next drain).
fn set_one_in(held: &mut u32, want: u32, what: &str, write: impl FnOnce() -> Result<(), aya::maps::MapError>) {
    if *held == want {
        return;
    }
    match write() {
        Ok(()) => {
            tracing::debug!(
                "limiter: capture of {what} {}",
                if want == 0 { "off".to_owned() } else { format!("on, one in {want}") }
            );
            *held = want;
        }
        Err(e) => tracing::warn!("limiter: switching the capture of {what}: {e}"),
    }
}
