//! SYN cookies as a feature of the daemon: while a class has cookies in
//! force, each second it judges whether the kernel takes the cookie ACKs
//! XDP verified (said in `limiter status`, `limiter_syn_cookies_refused`
//! and one log line per episode), and it marks the listeners on the
//! cookie classes' ports so the kernel keeps taking them.

use limiter_common::{Reason, cookie::mode, flags};

use super::acks::{CookieWatch, syncookies};
use crate::{
    control::StatusInfo,
    engine::feature::{Feature, InForce, Note, Second},
    policy::SynCookies,
    series::{Series, gauge},
};

#[derive(Debug, Default)]
pub(crate) struct Cookies {
    watch: CookieWatch,
    /// A class has SYN cookies in the data plane's config.
    classes: bool,
    /// The port ranges of the classes with SYN cookies in force (none
    /// while the program runs without them).
    ports: Vec<(u16, u16)>,
    /// The `auto` classes engaged at the last tick.
    engaged: Vec<String>,
    /// Engagements and releases since the last ask.
    notes: Vec<Note>,
}

impl Feature for Cookies {
    fn apply(&mut self, a: &InForce<'_>) {
        let on = a.config.flags & flags::SYN_COOKIES != 0;
        self.classes = a.config.cookies.mode.iter().take(a.class_names.len()).any(|m| *m != mode::OFF);
        self.ports = if on {
            let with = a.policy.classes.iter().filter(|c| c.syn_cookies != SynCookies::Off);
            with.flat_map(|c| c.ports.iter().copied()).collect()
        } else {
            Vec::new()
        };
    }

    fn tick(&mut self, second: &Second<'_>) {
        if self.classes {
            let verified = second.totals.get(Reason::SynCookieVerified).packets;
            let handed = second.totals.get(Reason::SynCookieToKernel).packets;
            self.watch.second(verified, handed, syncookies());
        }
        self.watch.arm(&self.ports);
        let now: Vec<String> = second
            .syn_cookies
            .iter()
            .filter(|c| c.mode == SynCookies::Auto && c.engaged)
            .map(|c| c.class.clone())
            .collect();
        let by = "syn cookies (auto)".to_owned();
        for class in now.iter().filter(|c| !self.engaged.contains(c)) {
            tracing::info!(event = "syn_cookies_engaged", class = %class, "limiter: SYN cookies engaged for class {class} (a SYN flood)");
            self.notes.push(Note { by: by.clone(), what: format!("engaged for class {class} (a SYN flood)") });
        }
        for class in self.engaged.iter().filter(|c| !now.contains(c)) {
            tracing::info!(event = "syn_cookies_released", class = %class, "limiter: SYN cookies released for class {class}");
            self.notes.push(Note { by: by.clone(), what: format!("released for class {class}") });
        }
        self.engaged = now;
    }

    fn notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    fn status(&self, status: &mut StatusInfo) {
        status.syn_cookies_failing.clone_from(&self.watch.refusing);
    }

    fn series(&self) -> Option<Box<dyn Series>> {
        self.classes.then(|| Box::new(Refused(self.watch.refusing.is_some())) as Box<dyn Series>)
    }
}

/// Whether the kernel answers the cookie ACKs XDP verified with RST.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) bool);

impl Series for Refused {
    fn encode(&self, enc: &mut prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        gauge(
            enc,
            "limiter_syn_cookies_refused",
            "1 while the kernel answers the cookie ACKs XDP verified with RST (it took none of them in the last 5 s: no route back to the SYNs' sources, most likely).",
            i64::from(self.0),
        )
    }
}
