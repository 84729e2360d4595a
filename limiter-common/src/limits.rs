//! The limits of one rule class as the kernel reads them: a token
//! bucket's (`unit`, `tau`) or a window quota's (slice length, limit).

use crate::{gcra, window};

/// Limits of one rule class, derived by [`ClassLimits::new`] so the kernel
/// never divides: a charge is `cost * unit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassLimits {
    /// [`gcra::unit_interval`]: the charge of one unit, in 1/16 ns.
    pub unit: u64,
    /// [`gcra::tau`]: how far a bucket may run ahead of now, in 1/16 ns.
    pub tau: u64,
    /// [`crate::cost::PACKETS`] or [`crate::cost::BYTES`].
    pub cost: u32,
    /// [`crate::mode::ENFORCE`] or [`crate::mode::SHADOW`].
    pub mode: u32,
    /// 0: a token bucket (`unit`, `tau` as above). Otherwise a window
    /// quota of this many slices ([`window`]): `unit` is the slice length
    /// in ns (slices are counted on the wall clock, which in 1/16 ns would
    /// not fit 64 bits) and `tau` the limit in cost units per window; read
    /// them as [`Self::slice_ns`] and [`Self::window_limit`].
    pub slices: u32,
    /// [`window::scope`] bits of a window quota.
    pub scope: u32,
}

impl ClassLimits {
    /// Limits for `rate` units/s and a depth of `burst` units, or `None` if
    /// `rate` is outside `1..=MAX_RATE` or `burst * unit` overflows.
    #[must_use]
    pub const fn new(rate: u64, burst: u64, cost: u32, mode: u32) -> Option<Self> {
        if rate == 0 || rate > gcra::MAX_RATE {
            return None;
        }
        let unit = gcra::unit_interval(rate);
        let Some(tau) = gcra::tau(burst, unit) else {
            return None;
        };
        Some(Self { unit, tau, cost, mode, slices: 0, scope: 0 })
    }

    /// A window quota of `limit` units per `slices` slices of `slice_ns`
    /// each, or `None` outside the bounds of [`window`].
    #[must_use]
    pub const fn window(limit: u64, slice_ns: u64, slices: u32, scope: u32, cost: u32, mode: u32) -> Option<Self> {
        if limit == 0 || limit > window::MAX_LIMIT || slices < 2 || slices as usize > window::MAX_SLICES {
            return None;
        }
        if slice_ns < window::MIN_SLICE_NS || slice_ns > window::MAX_SLICE_NS {
            return None;
        }
        Some(Self { unit: slice_ns, tau: limit, cost, mode, slices, scope })
    }

    /// Whether these are a window quota's limits (else a token bucket's).
    #[must_use]
    pub const fn is_window(&self) -> bool {
        self.slices != 0
    }

    /// A window quota's slice length in ns (kept in `unit`).
    #[must_use]
    pub const fn slice_ns(&self) -> u64 {
        self.unit
    }

    /// A window quota's limit in cost units per window (kept in `tau`).
    #[must_use]
    pub const fn window_limit(&self) -> u64 {
        self.tau
    }
}
