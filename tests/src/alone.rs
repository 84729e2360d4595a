//! One module at a time: a tier binary holds many modules, and libtest
//! runs its tests on two threads. Tests of one module may run side by side
//! (they always did: each was a binary of its own), tests of two modules
//! never do, so a flood in one cannot skew the latency or the ratio
//! another measures. Every test's first line takes its turn:
//! `let _alone = limiter_tests::alone(module_path!());`.

use std::sync::{Condvar, Mutex, PoisonError};

/// The module whose tests run now, and how many of them.
static ROOM: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
/// Signalled when the last test of a module ends.
static FREE: Condvar = Condvar::new();

/// A running test's turn; its module's turn ends with its last test.
#[must_use = "the turn ends when this is dropped"]
pub struct Alone(());

/// Wait until no test of another module runs, then run as one of
/// `module`'s.
pub fn alone(module: &'static str) -> Alone {
    let mut room = ROOM.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        match room.0 {
            None => *room = (Some(module), 1),
            Some(m) if m == module => room.1 += 1,
            Some(_) => {
                room = FREE.wait(room).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
        }
        return Alone(());
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        let mut room = ROOM.lock().unwrap_or_else(PoisonError::into_inner);
        room.1 -= 1;
        if room.1 == 0 {
            room.0 = None;
            FREE.notify_all();
        }
    }
}

/// A tier binary's modules: each compiled when the tier can run; built
/// by a user other than root (`tests/build.rs` sets
/// `limiter_tests_need_root`), the tier is one ignored test instead,
/// `TIER::needs_root`, that says so (and fails if run with `--ignored`);
/// `cargo xtask test` fails on it.
#[macro_export]
macro_rules! tier {
    ($tier:ident: $($module:ident),+ $(,)?) => {
        $(
            #[cfg(not(limiter_tests_need_root))]
            mod $module;
        )+

        /// Built by a user other than root: the tier cannot run.
        #[cfg(limiter_tests_need_root)]
        mod $tier {
            #[test]
            #[ignore = "this tier needs root: run `cargo xtask test` as root"]
            fn needs_root() {
                panic!(
                    "the {} tier needs root (BPF programs, network namespaces): run `cargo xtask test` as root",
                    stringify!($tier)
                );
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        thread,
        time::Duration,
    };

    use super::alone;

    /// Tests of one module share the room; a test of another waits for
    /// the room to empty, even while the first module's tests keep coming.
    #[test]
    fn two_modules_never_run_at_once_and_one_module_runs_side_by_side() {
        static A: AtomicUsize = AtomicUsize::new(0);
        static B: AtomicUsize = AtomicUsize::new(0);
        static MOST_A: AtomicUsize = AtomicUsize::new(0);
        let run = |module: &'static str, mine: &'static AtomicUsize, other: &'static AtomicUsize| {
            thread::spawn(move || {
                for _ in 0..20 {
                    let _alone = alone(module);
                    let n = mine.fetch_add(1, Ordering::SeqCst) + 1;
                    if module == "a" {
                        MOST_A.fetch_max(n, Ordering::SeqCst);
                    }
                    assert_eq!(other.load(Ordering::SeqCst), 0, "{module} ran beside the other module");
                    thread::sleep(Duration::from_millis(2));
                    mine.fetch_sub(1, Ordering::SeqCst);
                }
            })
        };
        let threads = [run("a", &A, &B), run("a", &A, &B), run("b", &B, &A), run("b", &B, &A), run("a", &A, &B)];
        for t in threads {
            t.join().expect("no module ran beside another");
        }
        assert!(MOST_A.load(Ordering::SeqCst) >= 2, "tests of one module ran side by side at least once");
    }
}
