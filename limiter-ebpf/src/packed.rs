//! `packed`, the one word of scalars the global charge and resolve
//! functions take besides the bucket key (a BPF-to-BPF call passes five
//! registers): the frame length (bits 0..16, clamped), the class (16..24,
//! `0..MAX_CLASSES`), the `CONFIG` slot (bit 24), whether this CPU's slot
//! is in use (25), whether the address was asked for finer denied
//! networks (26), the two requests below (27, 28), and the version
//! resolutions are cached under (32..64).

use limiter_common::MAX_CLASSES;

pub const CLASS_SHIFT: u32 = 16;
const _: () = assert!(MAX_CLASSES.is_power_of_two() && MAX_CLASSES <= 256, "the class is decoded by a mask");
pub const SLOT_BIT: u64 = 1 << 24;
pub const USABLE_BIT: u64 = 1 << 25;
pub const CHECKED: u64 = 1 << 26;
/// For `limiter_resolve`: store the resolution in the prefix's bucket.
pub const STORE: u64 = 1 << 27;
/// For `limiter_charge_bucket`: take the bucket's cached resolution
/// whatever its version.
pub const ANY_VERSION: u64 = 1 << 28;
