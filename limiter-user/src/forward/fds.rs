//! The daemon's descriptors, shared out so that the forwarders, whose
//! connections the Internet opens, never take the last of them: the
//! control socket, `/metrics`, feedback, the maps and the feeds keep a
//! reserve, and the operator can always ask the daemon what it is doing.
//! A forwarded connection holds two sockets, and with `copy = "splice"`
//! two pipes more ([`cost`]); past the budget a new one is shed at accept
//! (`descriptors`), as at the other caps.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::policy::forward::Copy;

/// The descriptors the forwarders may hold, shared by every forwarder of
/// the daemon's life (one permit a descriptor).
#[derive(Clone, Debug)]
pub struct Budget {
    pub slots: Arc<Semaphore>,
    /// The descriptors it holds in all.
    pub total: usize,
    /// The process's descriptor limit and its descriptors open when it
    /// was made.
    pub limit: u64,
    pub open: u64,
}

/// Descriptors always let in, however low the limit (then the reserve
/// is thinner, and the start-up log says so): 16 spliced connections.
const FLOOR: usize = 16 * 6;

/// Descriptors one connection holds: client and backend, and a pipe
/// (two) per direction when spliced.
#[must_use]
pub fn cost(copy: Copy) -> u32 {
    match copy {
        Copy::Splice => 6,
        Copy::Buffer => 2,
    }
}

impl Budget {
    /// The budget of this process now: its limit, less what is open, less
    /// `reserve` for the rest of the daemon.
    #[must_use]
    pub fn of_process(reserve: usize) -> Self {
        let limit = nofile();
        let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        Self::new(limit, open, reserve)
    }

    #[must_use]
    pub fn new(limit: u64, open: u64, reserve: usize) -> Self {
        let free = limit.saturating_sub(open).saturating_sub(reserve as u64);
        let total = usize::try_from(free).unwrap_or(Semaphore::MAX_PERMITS).clamp(FLOOR, Semaphore::MAX_PERMITS);
        Self { slots: Arc::new(Semaphore::new(total)), total, limit, open }
    }

    /// Connections of `copy` the whole budget holds.
    #[must_use]
    pub fn connections(&self, copy: Copy) -> usize {
        self.total / cost(copy) as usize
    }
}

fn nofile() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a plain syscall into a struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return u64::MAX;
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::{Budget, Copy, FLOOR};

    #[test]
    fn the_reserve_and_what_is_open_are_kept_and_a_connection_costs_its_descriptors() {
        let b = Budget::new(512, 70, 192);
        assert_eq!(b.total, 512 - 70 - 192);
        assert_eq!(b.slots.available_permits(), b.total);
        assert_eq!(b.connections(Copy::Buffer), 125);
        assert_eq!(b.connections(Copy::Splice), 41);
        // A limit too low for the reserve still lets a few in.
        assert_eq!(Budget::new(256, 70, 192).total, FLOOR);
        assert_eq!(Budget::new(256, 70, 192).connections(Copy::Splice), 16);
        // No limit: as many as a semaphore holds.
        assert_eq!(Budget::new(u64::MAX, 70, 192).total, tokio::sync::Semaphore::MAX_PERMITS);
    }
}
