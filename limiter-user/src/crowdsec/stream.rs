//! The decision stream decoded as it arrives: the body's chunks go to a
//! blocking thread, which reads the JSON one decision at a time and keeps
//! only the typed decisions, their names shared (`Arc<str>`, at most
//! [`MAX_INTERNED`] distinct). Neither the whole body nor the LAPI's
//! objects are ever held at once, and the daemon's event loop (one
//! thread) never decodes (an 850,000-decision answer decoded whole took
//! the RSS from 15 to 887 MB and held the loop for over a second).

use std::{collections::HashSet, fmt, io::Read, sync::Arc};

use hyper::body::Bytes;
use serde::{
    Deserializer as _,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use tokio::sync::mpsc;

use super::{Names, Pull, Raw, Skip, typed};

/// Distinct names (origins, scenarios, types) shared; past them each
/// decision has its own copy (a LAPI that names every decision apart
/// gains nothing).
pub const MAX_INTERNED: usize = 4096;

/// Names seen, shared.
#[derive(Default)]
pub(super) struct Shared(HashSet<Arc<Names>>);

impl Shared {
    pub(super) fn get(&mut self, names: Names) -> Arc<Names> {
        if let Some(n) = self.0.get(&names) {
            return Arc::clone(n);
        }
        let n = Arc::new(names);
        if self.0.len() < MAX_INTERNED {
            self.0.insert(Arc::clone(&n));
        }
        n
    }
}

/// The body's chunks as a reader (on the decoding thread).
pub(super) struct Chunks {
    rx: mpsc::Receiver<Bytes>,
    now: Bytes,
}

impl Chunks {
    pub(super) fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self { rx, now: Bytes::new() }
    }
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.now.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.now = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.now.len());
        buf[..n].copy_from_slice(&self.now[..n]);
        let _ = self.now.split_to(n);
        Ok(n)
    }
}

/// Decode a stream answer from `r`, one decision at a time.
pub(super) fn decode_from(r: impl Read) -> Result<Pull, serde_json::Error> {
    let mut pull = Pull::default();
    let mut names = Shared::default();
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(64 << 10, r));
    de.deserialize_map(StreamVisitor { pull: &mut pull, names: &mut names })?;
    de.end()?;
    Ok(pull)
}

struct StreamVisitor<'a> {
    pull: &'a mut Pull,
    names: &'a mut Shared,
}

impl<'de> Visitor<'de> for StreamVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a decision stream ({\"new\": [...], \"deleted\": [...]})")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "new" => map.next_value_seed(List { deleted: false, pull: self.pull, names: self.names })?,
                "deleted" => map.next_value_seed(List { deleted: true, pull: self.pull, names: self.names })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `new` or `deleted`: a list of decisions, or null.
struct List<'a> {
    deleted: bool,
    pull: &'a mut Pull,
    names: &'a mut Shared,
}

impl<'de> DeserializeSeed<'de> for List<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for List<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of decisions, or null")
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(r) = seq.next_element::<Raw>()? {
            match typed(&r, self.deleted, self.names) {
                Ok(d) if self.deleted => self.pull.deleted.push(d),
                Ok(d) => self.pull.new.push(d),
                Err(Skip::Scope) => self.pull.other_scope += 1,
                Err(Skip::Value) => self.pull.bad_value += 1,
                Err(Skip::Duration) => self.pull.bad_duration += 1,
            }
        }
        Ok(())
    }
}
