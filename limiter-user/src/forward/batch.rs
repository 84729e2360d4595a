//! Small writes of one runtime tick sent together: each connection that
//! read a small message queues its write here, and once the tick's ready
//! connections have all run, one `io_uring_enter(2)` sends them all.
//!
//! Why: the tenant layer often shares a CPU with the forwarder. A write
//! to it wakes it, and the kernel's scheduler lets it preempt the
//! forwarder at once, so one write a request means one switch a request
//! and the tenant layer answering one request per wake-up. Sent in one
//! system call, the writes of a tick all reach it before it runs, and it
//! answers them in one wake-up (measured: 0.04 switches a request
//! instead of 0.22; see docs/forward.md).
//!
//! Each write is `MSG_DONTWAIT`: what a socket cannot take at once comes
//! back, and the connection writes the rest itself when the socket can
//! take more, as without a batch. Where io_uring is not allowed (the
//! `kernel.io_uring_disabled` sysctl, a seccomp filter) nothing is
//! queued and every write goes out at once.

use std::{
    cell::RefCell,
    future::Future,
    io,
    os::fd::RawFd,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use io_uring::{IoUring, opcode, types};

/// Writes up to this size are queued (a small request or answer);
/// bigger ones go out at once.
pub const SMALL: usize = 4 << 10;
/// Submission queue entries (a tick with more queued writes sends them
/// in several calls).
const ENTRIES: u32 = 256;
/// Free buffers kept for reuse, at most `SMALL` bytes each.
const KEEP: usize = 256;

/// A queued write.
struct Slot {
    fd: RawFd,
    data: Vec<u8>,
    state: State,
    waker: Option<Waker>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Queued,
    /// The write's result: bytes taken, or a negative errno.
    Done(i32),
}

/// The runtime thread's batch.
struct Batch {
    ring: IoUring,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    spare: Vec<Vec<u8>>,
    queue: Vec<usize>,
    flusher: Option<Waker>,
    counts: Counts,
}

/// What a thread's batch has sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `io_uring_enter` calls that sent writes.
    pub calls: u64,
    /// Writes sent.
    pub writes: u64,
}

thread_local! {
    /// Present while this thread's runtime runs the flusher task.
    static BATCH: RefCell<Option<Batch>> = const { RefCell::new(None) };
}

/// Starts batching on the current runtime thread (once; later calls do
/// nothing). Where io_uring cannot be had, says so once a process, and
/// every write goes out at once.
pub fn start() {
    if BATCH.with(|b| b.borrow().is_some()) {
        return;
    }
    let ring = match IoUring::new(ENTRIES) {
        Ok(ring) => ring,
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!("limiter: forward: no io_uring here ({e}): each small write is its own system call");
            });
            return;
        }
    };
    BATCH.with(|b| {
        *b.borrow_mut() = Some(Batch {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            spare: Vec::new(),
            queue: Vec::new(),
            flusher: None,
            counts: Counts::default(),
        });
    });
    tokio::spawn(flusher());
}

/// Clears the thread's batch when the flusher task ends (its runtime
/// shut down): writes queued after that go out at once.
struct Ends;

impl Drop for Ends {
    fn drop(&mut self) {
        let _ = BATCH.try_with(|b| b.borrow_mut().take());
    }
}

/// Sends the queue each time it fills: woken by the first write queued
/// in a tick, it runs after the connections already scheduled.
async fn flusher() {
    let _ends = Ends;
    loop {
        std::future::poll_fn(|cx| {
            BATCH.with(|b| {
                let mut b = b.borrow_mut();
                let Some(b) = b.as_mut() else { return Poll::Ready(()) };
                if b.queue.is_empty() {
                    b.flusher = Some(cx.waker().clone());
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
        })
        .await;
        let sent = BATCH.with(|b| b.borrow_mut().as_mut().map(Batch::flush));
        match sent {
            Some(Ok(())) => {}
            // The ring failed: every write from now on goes out at once
            // (those waiting are woken to an error as the batch goes).
            Some(Err(e)) => {
                tracing::warn!("limiter: forward: io_uring send failed, writes go out one by one: {e}");
                let _ = BATCH.with(|b| b.borrow_mut().take());
                return;
            }
            None => return,
        }
    }
}

impl Batch {
    /// Sends the queued writes, as many as the ring holds (the rest stay
    /// queued for the flusher's next call), and waits for all their
    /// completions: each is `MSG_DONTWAIT`, so it completes or says
    /// EAGAIN inside the call.
    fn flush(&mut self) -> io::Result<()> {
        let queue = std::mem::take(&mut self.queue);
        let mut n = 0;
        {
            let mut sq = self.ring.submission();
            for (i, &id) in queue.iter().enumerate() {
                // A queued id's slot is taken until its write is released.
                let Some(slot) = self.slots[id].as_ref() else { continue };
                let len = u32::try_from(slot.data.len()).unwrap_or(u32::MAX);
                let send = opcode::Send::new(types::Fd(slot.fd), slot.data.as_ptr(), len)
                    .flags(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                    .build()
                    .user_data(id as u64);
                // SAFETY: the buffer lives in its slot, untouched until
                // its completion is read below (this call waits for all).
                if unsafe { sq.push(&send) }.is_err() {
                    self.queue.extend_from_slice(&queue[i..]);
                    break;
                }
                n += 1;
            }
        }
        if n == 0 {
            return Ok(());
        }
        self.counts.calls += 1;
        self.counts.writes += n as u64;
        self.ring.submit_and_wait(n)?;
        let mut done = 0;
        for cqe in self.ring.completion() {
            done += 1;
            let id = usize::try_from(cqe.user_data()).unwrap_or(usize::MAX);
            if let Some(slot) = self.slots.get_mut(id).and_then(Option::as_mut) {
                slot.state = State::Done(cqe.result());
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
            }
        }
        if done < n {
            return Err(io::Error::other(format!("{done} of {n} sends completed")));
        }
        Ok(())
    }

    fn release(&mut self, id: usize) {
        if let Some(mut slot) = self.slots[id].take() {
            if self.spare.len() < KEEP {
                slot.data.clear();
                self.spare.push(slot.data);
            }
            self.free.push(id);
        }
    }
}

/// A batch that ends (its ring failed, or its runtime shut down) wakes
/// the writes still waiting: with no batch they resolve to an error.
impl Drop for Batch {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut().flatten() {
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }
}

/// What this thread's batch has sent; `None` when it has none.
#[must_use]
pub fn counts() -> Option<Counts> {
    BATCH.with(|b| b.borrow().as_ref().map(|b| b.counts))
}

/// Queues `buf` (at most [`SMALL`] bytes) for `fd`; `None` when this
/// thread has no batch (the caller writes at once). The returned write
/// must be awaited before anything else is written to `fd`.
#[must_use]
pub fn queue(fd: RawFd, buf: &[u8]) -> Option<Queued> {
    debug_assert!(buf.len() <= SMALL);
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        let b = b.as_mut()?;
        let mut data = b.spare.pop().unwrap_or_else(|| Vec::with_capacity(SMALL));
        data.extend_from_slice(buf);
        let slot = Slot { fd, data, state: State::Queued, waker: None };
        let id = if let Some(id) = b.free.pop() {
            b.slots[id] = Some(slot);
            id
        } else {
            b.slots.push(Some(slot));
            b.slots.len() - 1
        };
        if b.queue.is_empty()
            && let Some(w) = b.flusher.take()
        {
            w.wake();
        }
        b.queue.push(id);
        Some(Queued { id, done: false })
    })
}

/// A queued write: resolves to the bytes the socket did not take (empty
/// when it took all), or the write's error. Awaited on the thread that
/// queued it (the forwarder's runtime has one thread).
pub struct Queued {
    id: usize,
    /// Resolved: its slot is free (and may be another write's).
    done: bool,
}

impl Future for Queued {
    type Output = io::Result<Vec<u8>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let id = this.id;
        let r = BATCH.with(|b| {
            let mut b = b.borrow_mut();
            // The runtime's batch ended (shut down): the write never went.
            let Some(b) = b.as_mut() else { return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())) };
            let Some(slot) = b.slots.get_mut(id).and_then(Option::as_mut) else {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            };
            match slot.state {
                State::Done(res) => {
                    let left = match usize::try_from(res) {
                        Ok(n) => Ok(slot.data[n.min(slot.data.len())..].to_vec()),
                        Err(_) if res == -libc::EAGAIN => Ok(std::mem::take(&mut slot.data)),
                        Err(_) => Err(io::Error::from_raw_os_error(-res)),
                    };
                    b.release(id);
                    Poll::Ready(left)
                }
                State::Queued => {
                    slot.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        });
        this.done = r.is_ready();
        r
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let id = self.id;
        let _ = BATCH.try_with(|b| {
            let Ok(mut b) = b.try_borrow_mut() else { return };
            let Some(b) = b.as_mut() else { return };
            // Not sent yet: never sent (its socket may close next, and its
            // descriptor be another connection's); sent: forgotten.
            b.queue.retain(|&q| q != id);
            b.release(id);
        });
    }
}

#[cfg(test)]
mod tests;
