//! The production program as a component of a libxdp dispatcher: the
//! dispatcher (libxdp's multi-program protocol) calls ten global stub
//! functions in turn, `prog0` .. `prog9`, each replaced by a component
//! through `freplace`, and goes on to the next while a component returns
//! one of its chain actions. [`limiter_chain`] is that component: the
//! same program as the `limiter` entry point, chained on `XDP_PASS`
//! only (a drop, a SYN cookie's `XDP_TX` end the chain).
//!
//! An `freplace` program is loaded against a target function of the same
//! type: [`limiter_slot`], in [`limiter_slot_host`], is one (the daemon
//! loads the component against it, then links it into the dispatcher's
//! slot). [`_limiter_chain`] is the run configuration libxdp reads from
//! the program's BTF (section `.xdp_run_config`): the priority is the
//! length of the `priority` array, which the daemon rewrites in the
//! object's BTF before loading it (`--priority`).

use aya_ebpf::{bindings::xdp_md, macros::xdp, programs::XdpContext};

/// A dispatcher slot's component (`freplace`): the production program.
#[unsafe(no_mangle)]
#[unsafe(link_section = "freplace")]
pub extern "C" fn limiter_chain(ctx: *mut xdp_md) -> u32 {
    crate::program::production(&XdpContext::new(ctx))
}

/// What a dispatcher's stub returns: go on to the next slot.
const DISPATCHER_RETVAL: u32 = 31;

/// A stub of a dispatcher slot's type, for [`limiter_chain`] to be
/// loaded against.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn limiter_slot(ctx: *mut xdp_md) -> u32 {
    if ctx.is_null() {
        return 0;
    }
    let ret = DISPATCHER_RETVAL;
    // SAFETY: a read of a local; volatile, so the value is not folded.
    unsafe { core::ptr::read_volatile(&raw const ret) }
}

/// The program holding [`limiter_slot`] (loaded, never attached).
#[xdp]
pub fn limiter_slot_host(ctx: XdpContext) -> u32 {
    limiter_slot(ctx.ctx)
}

/// libxdp's run configuration of `limiter_chain` (its `XDP_RUN_CONFIG`):
/// member names are read, array lengths are the values.
#[repr(C)]
#[expect(non_snake_case, reason = "libxdp reads the XDP action's name")]
pub struct RunConfig {
    priority: *const [i32; limiter_common::RUN_PRIORITY_DEFAULT as usize],
    XDP_PASS: *const [i32; 1],
}

// SAFETY: null pointers, never read: only their types matter (BTF).
unsafe impl Sync for RunConfig {}

#[unsafe(no_mangle)]
#[unsafe(link_section = ".xdp_run_config")]
#[used]
pub static _limiter_chain: RunConfig = RunConfig { priority: core::ptr::null(), XDP_PASS: core::ptr::null() };
