//! A listener's slots shared fairly among its peers: no peer holds more
//! than a quarter of them, and when the listener is full the oldest idle
//! connection of whoever holds most is shed to make room, so a client
//! holding and reopening connections can crowd out only itself. A
//! connection is busy while it is being answered (set by its handler
//! through [`Conn::busy`]) and never shed then.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::task::AbortHandle;

use super::peer::Peer;

/// One served connection as its handler sees it.
#[derive(Clone, Debug)]
pub struct Conn {
    pub peer: Peer,
    busy: Arc<AtomicBool>,
}

/// Held while a connection is being answered.
pub struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl Conn {
    /// Mark the connection busy until the guard is dropped.
    #[must_use]
    pub fn busy(&self) -> Busy {
        self.busy.store(true, Ordering::Relaxed);
        Busy(Arc::clone(&self.busy))
    }
}

struct Entry {
    peer: Peer,
    busy: Arc<AtomicBool>,
    abort: Option<AbortHandle>,
}

/// What [`Slots::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Served, under this id.
    Yes(u64),
    /// Served, after shedding an idle connection of this peer.
    Shed(u64, Peer),
    /// Refused: every connection that could make room is busy.
    No,
}

/// The live connections of one listener, oldest first.
pub struct Slots {
    max: usize,
    inner: Mutex<(u64, BTreeMap<u64, Entry>)>,
}

impl Slots {
    #[must_use]
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max: max.max(1), inner: Mutex::new((0, BTreeMap::new())) })
    }

    /// The most connections one peer may hold.
    #[must_use]
    pub fn share(&self) -> usize {
        (self.max / 4).max(1)
    }

    /// Make room for a connection of `peer`: past its share, its own
    /// oldest idle connection goes; with the listener full, the oldest
    /// idle connection of the peer holding most.
    pub fn admit(&self, peer: Peer) -> (Admit, Conn) {
        let busy = Arc::new(AtomicBool::new(false));
        let conn = Conn { peer, busy: Arc::clone(&busy) };
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, conns) = &mut *g;
        let mine = conns.values().filter(|e| e.peer == peer).count();
        let idle = |e: &Entry| !e.busy.load(Ordering::Relaxed);
        let victim = if mine >= self.share() {
            Some(conns.iter().find(|(_, e)| e.peer == peer && idle(e)).map(|(id, _)| *id))
        } else if conns.len() >= self.max {
            let held = |p: Peer| conns.values().filter(|e| e.peer == p).count();
            // Oldest first, so the first of the largest holding wins ties.
            let pick = conns.iter().filter(|(_, e)| idle(e)).fold(None::<(u64, usize)>, |best, (id, e)| {
                let n = held(e.peer);
                if best.is_none_or(|(_, m)| n > m) { Some((*id, n)) } else { best }
            });
            Some(pick.map(|(id, _)| id))
        } else {
            None
        };
        let shed = match victim {
            Some(None) => return (Admit::No, conn),
            Some(Some(id)) => conns.remove(&id).map(|e| {
                if let Some(a) = e.abort {
                    a.abort();
                }
                e.peer
            }),
            None => None,
        };
        let id = *next;
        *next += 1;
        conns.insert(id, Entry { peer, busy, abort: None });
        (shed.map_or(Admit::Yes(id), |p| Admit::Shed(id, p)), conn)
    }

    /// The task serving connection `id`, so that it can be shed.
    pub fn started(&self, id: u64, abort: AbortHandle) {
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match g.1.get_mut(&id) {
            Some(e) => e.abort = Some(abort),
            // Shed before it started.
            None => abort.abort(),
        }
    }

    /// Connection `id` ended.
    pub fn ended(&self, id: u64) {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.remove(&id);
    }

    #[cfg(test)]
    fn held(&self, peer: Peer) -> usize {
        self.inner.lock().unwrap().1.values().filter(|e| e.peer == peer).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Peer = Peer::Uid(1000);
    const B: Peer = Peer::Uid(0);
    const C: Peer = Peer::Uid(33);

    fn id(a: &Admit) -> u64 {
        match a {
            Admit::Yes(id) | Admit::Shed(id, _) => *id,
            Admit::No => panic!("refused"),
        }
    }

    #[test]
    fn a_peer_past_its_share_sheds_its_own_oldest_idle_connection() {
        let s = Slots::new(8);
        let first = id(&s.admit(A).0);
        let _second = s.admit(A).0;
        assert_eq!(s.held(A), 2);
        let (third, _) = s.admit(A);
        assert_eq!(third, Admit::Shed(first + 2, A), "A's oldest went");
        assert_eq!(s.held(A), 2, "A keeps its share and no more");
        // Others still get in.
        assert!(matches!(s.admit(B).0, Admit::Yes(_)));
    }

    #[test]
    fn busy_connections_are_never_shed() {
        let s = Slots::new(4);
        let (_, c) = s.admit(A);
        let busy = c.busy();
        assert_eq!(s.admit(A).0, Admit::No, "A's only connection is busy: A waits, nothing is cut");
        drop(busy);
        assert!(matches!(s.admit(A).0, Admit::Shed(_, A)));
    }

    #[test]
    fn a_full_listener_sheds_the_biggest_holders_oldest_idle() {
        let s = Slots::new(8);
        let (a0, _) = s.admit(A);
        let a0 = id(&a0);
        s.admit(A);
        for _ in 0..2 {
            s.admit(C);
        }
        // Fill up with distinct peers holding one each.
        for uid in 100..104 {
            s.admit(Peer::Uid(uid));
        }
        // Full; A (oldest among the holders of two) gives way.
        let (got, _) = s.admit(B);
        assert_eq!(got, Admit::Shed(a0 + 8, A));
        assert_eq!(s.held(B), 1);
        s.ended(a0 + 1);
        assert_eq!(s.held(A), 0);
    }
}
