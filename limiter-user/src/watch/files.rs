//! The files of every section of one kind (`[[feed]]`, `[[source]]`),
//! each watched ([`Watch`]) with a state of the source's own beside it:
//! sections followed as the policy changes (an unchanged one keeps its
//! watch and state), every file read again on SIGHUP, each whose turn it
//! is read off the loop, and the reads taken back, each version that read
//! whole or failed handed to the source once its bookkeeping is done.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Looked, Watch};

/// What a section that names a watched file says of it.
pub trait Section: Clone + PartialEq + Send + 'static {
    fn name(&self) -> &str;
    fn path(&self) -> &std::path::Path;
    fn refresh(&self) -> Duration;
}

/// One section's file, its watch, and the source's state `X` of it.
#[derive(Debug)]
pub struct Entry<S, X> {
    pub spec: S,
    pub watch: Watch,
    pub state: X,
}

/// A read that came back: the section it was read under, and what was
/// found.
type Read<S, V, E> = (S, Looked<Result<V, E>>);

/// A version that came back, with its section's entry.
pub type Back<'a, S, X, V, E> = (&'a mut Entry<S, X>, Result<V, E>);

/// Every watched file of one kind of section.
#[derive(Debug)]
pub struct Files<S, V, E, X> {
    entries: Vec<Entry<S, X>>,
    /// Where the reads off the loop come back (taken at each tick).
    tx: mpsc::Sender<Read<S, V, E>>,
    rx: mpsc::Receiver<Read<S, V, E>>,
}

impl<S: Section, V: Send + 'static, E: Send + 'static, X> Files<S, V, E, X> {
    /// Room for `max` reads in flight (one per section).
    #[must_use]
    pub fn new(max: usize) -> Self {
        let (tx, rx) = mpsc::channel(max.max(1));
        Self { entries: Vec::new(), tx, rx }
    }

    /// Exactly `specs`: an unchanged section keeps its watch and state, a
    /// new or changed one starts with `state` and is read at the next tick.
    pub fn follow(&mut self, specs: &[S], state: impl Fn(&S) -> X) {
        let mut next = Vec::with_capacity(specs.len());
        for spec in specs {
            match self.entries.iter().position(|e| e.spec == *spec) {
                Some(i) => next.push(self.entries.swap_remove(i)),
                None => next.push(Entry { spec: spec.clone(), watch: Watch::new(), state: state(spec) }),
            }
        }
        self.entries = next;
    }

    /// SIGHUP: every file is read again.
    pub fn force_all(&mut self) {
        self.entries.iter_mut().for_each(|e| e.watch.force());
    }

    /// Look at each file whose turn it is, off the loop, with `read`.
    pub fn look(&mut self, read: impl Fn(&S) -> Result<V, E> + Clone + Send + 'static) {
        let now = Instant::now();
        for e in &mut self.entries {
            let Some(turn) = e.watch.turn(now, e.spec.refresh()) else { continue };
            let (spec, tx, read) = (e.spec.clone(), self.tx.clone(), read.clone());
            let for_read = spec.clone();
            turn.spawn(
                e.spec.path().to_owned(),
                move |_| read(&for_read),
                move |looked| tx.blocking_send((spec, looked)).is_ok(),
            );
        }
    }

    /// The next version that came back read whole (`Ok`) or not (`Err`),
    /// with its section's entry, the watch told of it; reads of a file
    /// being written, of a section changed meanwhile, or that found the
    /// file unchanged are taken care of here.
    pub fn read_back(&mut self) -> Option<Back<'_, S, X, V, E>> {
        loop {
            let (spec, looked) = self.rx.try_recv().ok()?;
            let Some(i) = self.entries.iter().position(|e| e.spec.name() == spec.name()) else { continue };
            let e = &mut self.entries[i];
            if !e.watch.back(&looked) || e.spec != spec {
                // Being written, or the section changed while it was read.
                e.watch.force();
                continue;
            }
            match looked.result {
                None => {}
                Some(Ok(v)) => {
                    e.watch.read(looked.stamp);
                    return Some((&mut self.entries[i], Ok(v)));
                }
                Some(Err(err)) => {
                    e.watch.failed();
                    return Some((&mut self.entries[i], Err(err)));
                }
            }
        }
    }

    /// Every entry, in the policy's order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry<S, X>> {
        self.entries.iter()
    }

    /// The entry of the section called `name`.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Entry<S, X>> {
        self.entries.iter_mut().find(|e| e.spec.name() == name)
    }
}
