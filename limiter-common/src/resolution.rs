//! What an override lookup resolves a prefix to (the LPM trie's value and
//! the low half of [`crate::BucketState::resolved`]).

/// No override: the class's own limits.
pub const CLASS: u32 = 0;
/// `allow`: never limited.
pub const ALLOW: u32 = u32::MAX;
/// `deny`: always dropped.
pub const DENY: u32 = u32::MAX - 1;
// 1..=MAX_OVERRIDES: the override's limits, for the default class.
/// Bit: denied by the deny set (`crate::deny`), below the overrides;
/// the low 16 bits name the origin. Never with [`FINER`].
pub const LISTED: u32 = 1 << 29;
/// Bit, beside [`CLASS`] or an override: networks finer than the
/// bucket's prefix are denied inside it, so each packet asks whether
/// its own address is one (and the bucket is never leased).
pub const FINER: u32 = 1 << 30;
/// Bit, beside [`CLASS`] only (an override outranks a group): the
/// prefix is in the group whose index is in the bits of
/// [`GROUP_INDEX`] (`crate::groups`), which an override's index may
/// use only without it. With [`FINER`], never with [`LISTED`].
pub const GROUP: u32 = 1 << 28;
/// Bit, with [`GROUP`]: an enforced `allow` group (passed uncharged,
/// counted under the group).
pub const GROUP_ALLOWS: u32 = 1 << 27;
/// The bits of a group's index, shifted by [`GROUP_SHIFT`].
pub const GROUP_INDEX: u32 = 0xff << GROUP_SHIFT;
/// Where a group's index starts.
pub const GROUP_SHIFT: u32 = 16;

/// `CLASS` in a group: the resolution that says so.
#[inline(always)]
#[must_use]
pub const fn grouped(index: u32) -> u32 {
    GROUP | (index << GROUP_SHIFT & GROUP_INDEX)
}

/// The group index `res` (not [`ALLOW`] nor [`DENY`]) names, if any.
#[inline(always)]
#[must_use]
pub const fn group(res: u32) -> Option<u32> {
    if res != ALLOW && res != DENY && res & LISTED == 0 && res & GROUP != 0 {
        Some((res & GROUP_INDEX) >> GROUP_SHIFT)
    } else {
        None
    }
}

/// The group index of an enforced `allow` group `res` names, if any.
#[inline(always)]
#[must_use]
pub const fn allowing_group(res: u32) -> Option<u32> {
    match group(res) {
        Some(g) if res & GROUP_ALLOWS != 0 => Some(g),
        _ => None,
    }
}

/// `res` without a group's bits: what it says of the prefix itself.
#[inline(always)]
#[must_use]
pub const fn ungrouped(res: u32) -> u32 {
    if group(res).is_some() { res & !(GROUP | GROUP_ALLOWS | GROUP_INDEX) } else { res }
}

/// `res` without the group's bits and [`FINER`]: what picks the limits.
#[inline(always)]
#[must_use]
pub const fn limits_key(res: u32) -> u32 {
    if res == ALLOW || res == DENY || res & LISTED != 0 {
        res
    } else if res & GROUP != 0 {
        CLASS
    } else {
        res & !FINER
    }
}

/// Whether `res` (not [`ALLOW`] nor [`DENY`]) is a deny-set denial.
#[inline(always)]
#[must_use]
pub const fn listed(res: u32) -> bool {
    res != ALLOW && res != DENY && res & LISTED != 0
}
