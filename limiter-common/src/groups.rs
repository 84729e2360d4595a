//! Country and ASN groups: every address of a group shares one budget
//! (`rate`/`burst`), passes uncharged (`allow`) or is dropped (`deny`).
//!
//! Two LPM tries ([`crate::maps::GROUPS4`], [`crate::maps::GROUPS6`])
//! hold each group's networks, valued with its index, at no length finer
//! than the bucket prefix: a bucket prefix belongs to a group only when
//! the group holds all of it. A bucket asks them once, when it resolves
//! (and caches the answer in its resolution, [`crate::resolution::GROUP`]);
//! a packet of a rate group is charged to its prefix's bucket and then to
//! its group's ([`crate::maps::GROUP_BUCKETS`], one GCRA state shared by
//! every CPU), or to neither.

/// Groups one policy may hold.
pub const MAX_GROUPS: u32 = 64;
/// Networks of the tries (each family): a million.
pub const MAX_NETWORKS: u32 = 1 << 20;

/// What a group does ([`GroupLimits::action`]).
pub mod action {
    /// No group at this index (in this policy).
    pub const NONE: u32 = 0;
    /// Its addresses share one budget.
    pub const RATE: u32 = 1;
    /// Its addresses pass uncharged.
    pub const ALLOW: u32 = 2;
    /// Its addresses are dropped.
    pub const DENY: u32 = 3;
}

/// The bit of a deny-set origin (`crate::deny::ORIGIN`) that says the
/// low bits name a `deny` group instead: an enforced `deny` group's
/// prefix resolves as the deny set's networks do
/// (`crate::resolution::LISTED`), so that it costs what they cost.
pub const DENIED_ORIGIN: u32 = 0x8000;

/// Value of [`crate::maps::GROUP_LIMITS`] (per `CONFIG` slot, at `slot *
/// MAX_GROUPS + index`): what the group does, and its budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupLimits {
    /// [`crate::gcra::unit_interval`] of the group's rate (packets/s).
    pub unit: u64,
    /// [`crate::gcra::tau`] of its burst.
    pub tau: u64,
    /// [`action`].
    pub action: u32,
    /// [`crate::mode::ENFORCE`] or [`crate::mode::SHADOW`].
    pub mode: u32,
}

impl GroupLimits {
    /// A shared budget of `rate` packets/s and `burst` packets, or `None`
    /// outside `1..=MAX_RATE` (or a burst that overflows).
    #[must_use]
    pub const fn rate(rate: u64, burst: u64, mode: u32) -> Option<Self> {
        // A class's bucket of packets: the same arithmetic.
        match crate::ClassLimits::new(rate, burst, crate::cost::PACKETS, mode) {
            Some(c) => Some(Self { unit: c.unit, tau: c.tau, action: action::RATE, mode }),
            None => None,
        }
    }

    /// Its addresses pass uncharged ([`action::ALLOW`]) or are dropped
    /// ([`action::DENY`]).
    #[must_use]
    pub const fn decide(action: u32, mode: u32) -> Self {
        Self { unit: 0, tau: 0, action, mode }
    }
}

/// Value of [`crate::maps::GROUP_HITS`] (per CPU, per group index):
/// packets of the group passed and dropped (or, in shadow mode, passed
/// that would have been dropped), and this CPU's lease of the group's
/// budget: `lease_credit` taken from it ahead (at most
/// [`crate::lease::lease`] of the group's limits, under the same rule as a
/// bucket's lease, [`crate::lease::admit`]), spent a packet at a time by
/// this CPU alone, given back when it expires or the policy changes.
/// One entry, so that a packet admitted from a bucket's lease is charged
/// to its group and counted with one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupHits {
    pub passed: u64,
    pub dropped: u64,
    /// Unspent credit of the lease, in 1/16 ns of the group's `tat`.
    pub lease_credit: u64,
    /// The charge of one packet under the lease (the group's `unit`).
    pub lease_unit: u64,
    /// The lease expires at (1/16 ns).
    pub lease_until: u64,
    /// Low 32 bits of the policy version the lease was taken under.
    pub lease_version: u32,
    /// Always zero (explicit padding).
    pub pad: u32,
}

impl GroupHits {
    /// Whether the lease admits one more packet under `version` at `now`.
    #[inline(always)]
    #[must_use]
    pub const fn lease_holds(&self, version: u32, now: u64) -> bool {
        // An empty entry's unit is 0: wrapped, no credit is above it.
        self.lease_version == version && now < self.lease_until && self.lease_credit > self.lease_unit.wrapping_sub(1)
    }

    /// One packet taken from the lease (which [`Self::lease_holds`]).
    #[inline(always)]
    pub const fn spend(&mut self) {
        self.lease_credit -= self.lease_unit;
    }
}

impl core::ops::AddAssign for GroupHits {
    fn add_assign(&mut self, o: Self) {
        self.passed += o.passed;
        self.dropped += o.dropped;
    }
}

/// Key of [`crate::maps::GROUPS6`]: the top 64 bits of an IPv6 network
/// (a bucket prefix is never finer than /64), network order.
pub type V6Key = [u32; 2];
