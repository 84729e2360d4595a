//! Frames the data plane copied at the driver (`CAPTURES`), as the
//! daemon hands them on: to `limiter capture`'s taps ([`taps`]) and to
//! each attack's pcap, written as pcapng ([`pcapng`]) with every frame's
//! verdict, reason and class in its comment. The data plane copies drops
//! only while `CAPTURE` says so ([`Want`]), and passes only while its
//! global `LIMITER_PASSES` does (a random one in N, N chosen each second
//! from the passed rate so that no more than asked are copied:
//! [`passes_one_in`]); the daemon turns each on while a tap or an attack
//! wants those frames, and off when none does.

pub mod pcapng;
pub mod taps;

use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use limiter_common::{
    Action, Reason,
    capture::{CaptureCtl, CaptureHead, SNAP},
    family,
    packet::{self, Source},
};

/// One frame the data plane copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// When it was copied, in nanoseconds since the Unix epoch.
    pub t_ns: u64,
    /// Its length on the wire.
    pub len: u32,
    /// Its first bytes (up to [`SNAP`]).
    pub data: Vec<u8>,
    pub reason: Reason,
    pub class: u8,
    /// It was copied as one in this many of its kind drawn at random (1:
    /// every one).
    pub one_in: u32,
}

impl Frame {
    /// A record of `CAPTURES`, its monotonic stamp moved to the wall
    /// clock by `offset_ns` (wall minus monotonic); `None` if it is cut
    /// short or says what cannot be.
    #[must_use]
    pub fn decode(record: &[u8], offset_ns: i128) -> Option<Frame> {
        let head_len = size_of::<CaptureHead>();
        let head = record.get(..head_len)?;
        let word = |i: usize| u32::from_ne_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let t = u64::from_ne_bytes(head[..8].try_into().ok()?);
        let (len, caplen, reason, class, one_in) = (word(8), word(12), word(16), word(20), word(24));
        let caplen = usize::try_from(caplen).ok().filter(|c| (1..=SNAP).contains(c))?;
        let data = record.get(head_len..head_len + caplen)?.to_vec();
        let t_ns = u64::try_from((i128::from(t) + offset_ns).max(0)).unwrap_or(u64::MAX);
        Some(Frame {
            t_ns,
            len: len.max(u32::try_from(caplen).unwrap_or(u32::MAX)),
            data,
            reason: Reason::from_index(reason)?,
            class: u8::try_from(class).ok()?,
            one_in: one_in.max(1),
        })
    }

    /// Whether the program passed it (a would-be drop of shadow mode is
    /// not a pass: it is a drop the operator asked to see first).
    #[must_use]
    pub fn passed(&self) -> bool {
        self.reason.action() == Action::Pass
    }

    /// What the program read of its headers.
    #[must_use]
    pub fn source(&self) -> Option<Source> {
        let mut fam = family::NONE;
        packet::parse(self.data.as_slice(), &mut fam).ok()
    }

    /// Its source address.
    #[must_use]
    pub fn source_ip(&self) -> Option<std::net::IpAddr> {
        Some(self.source()?.ip())
    }
}

/// An IP protocol's name: `tcp`, `udp`, `icmp` (either family's), or
/// `proto N`.
#[must_use]
pub fn protocol(proto: u8) -> std::borrow::Cow<'static, str> {
    match proto {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 | 58 => "icmp".into(),
        p => format!("proto {p}").into(),
    }
}

/// Wall clock minus the monotonic clock, in nanoseconds (what moves the
/// data plane's stamps to UTC).
#[must_use]
pub fn clock_offset() -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    let mono = i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(0));
    wall - mono
}

/// Which frames a tap or a pcap takes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    /// Only this reason (its label, `rate_limited`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Only sources inside this network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<IpNet>,
    /// Only this class (its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The frames passed (a random sample) instead of those dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passed: bool,
}

impl Filter {
    /// Whether `f` passes it (`class_names` by class index).
    #[must_use]
    pub fn takes(&self, f: &Frame, class_names: &[String]) -> bool {
        if f.passed() != self.passed {
            return false;
        }
        if self.reason.as_deref().is_some_and(|r| r != f.reason.label()) {
            return false;
        }
        if let Some(c) = &self.class
            && class_name(class_names, f.class) != c.as_str()
        {
            return false;
        }
        match &self.prefix {
            Some(net) => f.source_ip().is_some_and(|ip| net.contains(&ip)),
            None => true,
        }
    }

    /// The filter's reason and class checked against what exists: the
    /// message for a word that names none.
    pub fn check(&self, class_names: &[String]) -> Result<(), String> {
        if let Some(r) = &self.reason {
            let Some(reason) = (0..limiter_common::REASON_COUNT)
                .filter_map(|i| Reason::from_index(u32::try_from(i).ok()?))
                .find(|x| x.label() == r)
            else {
                return Err(format!("no reason is named {r:?} (see `limiter stats` for their names)"));
            };
            let passes = reason.action() == Action::Pass;
            if passes != self.passed {
                return Err(if passes {
                    format!("{r} is a reason to pass: add --passed to see passed frames")
                } else {
                    format!("{r} is a reason to drop: --passed shows passed frames only")
                });
            }
        }
        if let Some(c) = &self.class
            && !class_names.iter().any(|n| n == c)
        {
            return Err(format!("no class is named {c:?}; the policy's classes: {}", class_names.join(", ")));
        }
        Ok(())
    }
}

/// A class's name (`default` for class 0 when the policy names none).
#[must_use]
pub fn class_name(class_names: &[String], class: u8) -> &str {
    class_names.get(usize::from(class)).map_or("default", String::as_str)
}

/// What one wanter of dropped frames asks of the data plane: every drop,
/// or one in `n` (a power of two) at random.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Every,
    OneIn(u32),
}

/// `CAPTURE`'s entry for all that is wanted: off when nothing is, else
/// the densest draw any wanter asks.
#[must_use]
pub fn ctl(wants: impl IntoIterator<Item = Want>) -> CaptureCtl {
    let one_in = wants
        .into_iter()
        .map(|w| match w {
            Want::Every => 1,
            Want::OneIn(n) => n.clamp(1, 1 << 31).next_power_of_two(),
        })
        .min()
        .unwrap_or(0);
    CaptureCtl { one_in, ..CaptureCtl::default() }
}

/// `LIMITER_PASSES` for passes wanted at most `per_second` each (the
/// largest of the wanters' asks), when `passed` packets passed in the
/// last second: the smallest power of two that copies no more than that
/// many a second at this rate; 0 (none copied) when nobody asks.
#[must_use]
pub fn passes_one_in(per_second: impl IntoIterator<Item = u64>, passed: u64) -> u32 {
    let Some(wanted) = per_second.into_iter().max().filter(|w| *w > 0) else { return 0 };
    let n = passed.div_ceil(wanted).clamp(1, 1 << 31);
    u32::try_from(n.next_power_of_two()).unwrap_or(1 << 31)
}

#[cfg(test)]
mod tests;
