//! The layout of what crosses the kernel/user boundary: every key and
//! value's size asserted at compile time (no implicit padding), and, for
//! userspace, the `Pod` marks aya reads and writes them with.

use crate::{
    AnswerKey, BucketKey, BucketState, ClassCounters, ClassLimits, ClockCache, Config, Counter, DropEvent, MAX_CLASSES,
    MAX_MATCHERS, Matcher, Meta, RuntimeKey, RuntimeOverride, capture, cookie, deny, groups, lease, maps, resolution,
};

const _: () = assert!(core::mem::size_of::<ClassLimits>() == 32);
const _: () = assert!(core::mem::size_of::<Matcher>() == 8);
const _: () = assert!(core::mem::size_of::<Config>() == 72 + 32 * MAX_CLASSES + 8 * MAX_MATCHERS + 88);
const _: () = assert!(core::mem::size_of::<cookie::Cookies>() == 88);
const _: () = assert!(core::mem::size_of::<cookie::SynGuard>() == 24);
const _: () = assert!(core::mem::size_of::<DropEvent>() == 40);
const _: () = assert!(core::mem::size_of::<crate::tcp_state::Held>() == 48);
const _: () = assert!(crate::tcp_state::HELD_ENTRIES.is_power_of_two());
const _: () = assert!(core::mem::size_of::<capture::CaptureCtl>() == 16);
const _: () = assert!(core::mem::size_of::<capture::CaptureHead>() == 32);
const _: () = assert!(core::mem::size_of::<capture::CaptureRecord>() == 32 + capture::SNAP);
const _: () = assert!(core::mem::size_of::<AnswerKey>() == 40);
const _: () = assert!(core::mem::size_of::<BucketKey>() == 12);
const _: () = assert!(core::mem::size_of::<BucketState>() == 16);
const _: () = assert!(core::mem::size_of::<ClassCounters>() == 48);
const _: () = assert!(core::mem::size_of::<Counter>() == 16);
const _: () = assert!(core::mem::size_of::<ClockCache>() == 16);
const _: () = assert!(core::mem::size_of::<Meta>() == 16);
const _: () = assert!(core::mem::size_of::<lease::CpuSlot>() == 48);
const _: () = assert!(core::mem::size_of::<RuntimeKey>() == 20);
const _: () = assert!(core::mem::size_of::<RuntimeOverride>() == 32);
const _: () = assert!(maps::CPU_SLOTS_ENTRIES.is_power_of_two());
const _: () = assert!(core::mem::size_of::<deny::DenyKey>() == 20);
const _: () = assert!(core::mem::size_of::<deny::DenyLens>() == 2 * deny::MAX_LENS);
const _: () = assert!(core::mem::size_of::<deny::OriginName>() == deny::ORIGIN_NAME);
const _: () = assert!(core::mem::size_of::<groups::GroupLimits>() == 24);
const _: () = assert!(core::mem::size_of::<groups::GroupHits>() == 48);
const _: () = assert!(core::mem::size_of::<crate::tunnel::ServiceKey>() == 20);
const _: () = assert!(core::mem::size_of::<crate::tunnel::Service>() == 28);
const _: () = assert!(core::mem::size_of::<crate::tunnel::Backend>() == 24);
const _: () = assert!(core::mem::size_of::<crate::tunnel::Flow>() == 40);
const _: () = assert!(core::mem::size_of::<crate::tunnel::Hop>() == 32);
const _: () = assert!(maps::MAX_OVERRIDES < resolution::GROUP);
const _: () = assert!(groups::MAX_GROUPS <= resolution::GROUP_INDEX >> resolution::GROUP_SHIFT);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are #[repr(C)], Copy, contain only integers and have
    // no implicit padding (sizes asserted above).
    unsafe impl aya::Pod for crate::Config {}
    unsafe impl aya::Pod for crate::BucketKey {}
    unsafe impl aya::Pod for crate::BucketState {}
    unsafe impl aya::Pod for crate::Counter {}
    unsafe impl aya::Pod for crate::Meta {}
    unsafe impl aya::Pod for crate::ClassCounters {}
    unsafe impl aya::Pod for crate::ClassLimits {}
    unsafe impl aya::Pod for crate::DropEvent {}
    unsafe impl aya::Pod for crate::capture::CaptureCtl {}
    unsafe impl aya::Pod for crate::capture::CaptureHead {}
    unsafe impl aya::Pod for crate::AnswerKey {}
    unsafe impl aya::Pod for crate::lease::CpuSlot {}
    unsafe impl aya::Pod for crate::ClockCache {}
    unsafe impl aya::Pod for crate::window::WindowState {}
    unsafe impl aya::Pod for crate::window::Touch {}
    unsafe impl aya::Pod for crate::cookie::SynGuard {}
    unsafe impl aya::Pod for crate::RuntimeKey {}
    unsafe impl aya::Pod for crate::RuntimeOverride {}
    unsafe impl aya::Pod for crate::deny::DenyKey {}
    unsafe impl aya::Pod for crate::deny::DenyLens {}
    unsafe impl aya::Pod for crate::deny::OriginName {}
    unsafe impl aya::Pod for crate::groups::GroupLimits {}
    unsafe impl aya::Pod for crate::groups::GroupHits {}
    unsafe impl aya::Pod for crate::tunnel::ServiceKey {}
    unsafe impl aya::Pod for crate::tunnel::Service {}
    unsafe impl aya::Pod for crate::tunnel::Backend {}
    unsafe impl aya::Pod for crate::tunnel::Flow {}
    unsafe impl aya::Pod for crate::tunnel::Hop {}
}
