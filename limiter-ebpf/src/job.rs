//! What a global charge function (the bucket's, the new prefix's, the
//! window's, the group's) needs of a packet, rebuilt from its arguments:
//! the policy, the bucket, the class, the time and the length; and the
//! limits the prefix's resolution picks.

use limiter_common::{BucketKey, ClassLimits, Config, MAX_CLASSES, maps::MAX_OVERRIDES, resolution};

use crate::{
    maps::{CONFIG, OVR_LIMITS},
    packed::{CLASS_SHIFT, SLOT_BIT},
};

/// What the charge itself needs of a packet: its bucket and its length,
/// under one policy at one instant.
pub struct Job<'a> {
    /// The policy (a `CONFIG` entry).
    pub cfg: &'a Config,
    pub key: BucketKey,
    pub class: usize,
    /// The `CONFIG` slot and its policy version.
    pub slot: u32,
    pub version: u32,
    pub now: u64,
    pub len: u64,
}

/// The job of a global charge function, from `packed` (see `charge`).
#[inline(always)]
pub fn job(head: u64, tail: u64, now: u64, packed: u64) -> Option<Job<'static>> {
    let slot = u32::from(packed & SLOT_BIT != 0);
    let cfg = CONFIG.get(slot)?;
    let key = BucketKey::from_words(head, tail);
    // Masked to the class table's size rather than checked against it:
    // the index is spilled to the stack before `limits_for` uses it, and
    // the verifier of 6.1 (before 6.8's "assign ID to scalars on spill")
    // does not carry a comparison's bound to the spilled copy, so only a
    // bound made by the value itself reaches the table lookup (with `& 0xff`
    // 6.1 refused the program: "R5 max value is outside of the allowed
    // memory range", off=8256 into the 544-byte `CONFIG` value).
    let class = ((packed >> CLASS_SHIFT) as usize) & (MAX_CLASSES - 1);
    Some(Job { cfg, key, class, slot, version: (packed >> 32) as u32, now, len: packed & 0xffff })
}

/// Limits for a packet of `class` whose prefix resolved to `res`: an
/// override's own limits apply to the default class only.
#[inline(always)]
pub fn limits_for(cfg: &Config, class: usize, slot: u32, res: u32) -> Option<&ClassLimits> {
    let res = resolution::limits_key(res);
    if res != resolution::CLASS && class == 0 && res <= MAX_OVERRIDES {
        return OVR_LIMITS.get(slot * MAX_OVERRIDES + res - 1);
    }
    cfg.classes.get(class)
}
