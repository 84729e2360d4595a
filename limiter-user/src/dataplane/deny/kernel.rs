//! The deny set's maps, and a [`DenyWrites`] written into them in order.

use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, IterableMap as _, MapData};
use limiter_common::{
    deny::{DenyKey, DenyLens, OriginName, active},
    maps,
};

use super::{
    super::{LoadError, error::Named as _, rawmap},
    DenyWrites,
};

/// How long a packet may still read the `DENY_LENS` slot (or `CONFIG`
/// slot) `ACTIVE` named before a flip: a slot is rewritten only after it.
pub(crate) const SETTLE: Duration = Duration::from_millis(2);

/// `DENY`, `DENY_LENS` and `DENY_ORIGINS`.
pub struct DenyMaps {
    pub(crate) deny: HashMap<MapData, DenyKey, u32>,
    pub(crate) lens: Array<MapData, DenyLens>,
    pub(crate) origins: Array<MapData, OriginName>,
}

/// `ACTIVE` and when it last flipped a slot, shared with the policy's
/// writer.
pub(crate) struct Active<'a> {
    pub map: &'a mut Array<MapData, u32>,
    pub last_flip: &'a mut Option<Instant>,
}

impl Active<'_> {
    fn get(&self) -> Result<u32, LoadError> {
        self.map.get(&0, 0).on(maps::ACTIVE)
    }

    /// Store `word` (one 4-byte store); a flip of a slot is remembered.
    fn set(&mut self, word: u32, flipped: bool) -> Result<(), LoadError> {
        self.map.set(0, word, 0).on(maps::ACTIVE)?;
        if flipped {
            *self.last_flip = Some(Instant::now());
        }
        Ok(())
    }

    /// Wait until the idle slots are no longer read.
    fn settle(&self) {
        if let Some(t) = *self.last_flip {
            std::thread::sleep(SETTLE.saturating_sub(t.elapsed()));
        }
    }
}

impl DenyMaps {
    /// Write `ch`: the lengths in use grow, entries are written, then
    /// removed, then `ACTIVE`'s change count moves (with the lengths'
    /// slot, if they shrink) so that every bucket resolves again.
    pub(crate) fn write(&mut self, mut act: Active, ch: &DenyWrites) -> Result<(), LoadError> {
        let mut word = act.get()?;
        if let Some(l) = &ch.lens_during {
            word = self.flip_lens(&mut act, word, l)?;
        }
        let size = size_of::<DenyKey>();
        if !ch.upserts.is_empty() {
            let mut keys = Vec::with_capacity(ch.upserts.len() * size);
            let mut values = Vec::with_capacity(ch.upserts.len() * 4);
            for (k, v) in &ch.upserts {
                keys.extend_from_slice(key_bytes(k));
                values.extend_from_slice(&v.to_ne_bytes());
            }
            rawmap::update_batch(self.deny.map(), &keys, &values, size, 4).map_err(io_error)?;
        }
        if !ch.deletes.is_empty() {
            let keys: Vec<u8> = ch.deletes.iter().flat_map(|k| key_bytes(k).iter().copied()).collect();
            rawmap::delete_batch(self.deny.map(), &keys, size).map_err(io_error)?;
        }
        let count = (word >> active::COUNT_SHIFT).wrapping_add(1);
        let mut next = (word & (active::CONFIG_SLOT | active::LENS_SLOT)) | count << active::COUNT_SHIFT;
        let mut flipped = false;
        if let Some(l) = &ch.lens_after {
            act.settle();
            self.lens.set(idle(next), l, 0).on(maps::DENY_LENS)?;
            next ^= active::LENS_SLOT;
            flipped = true;
        }
        act.set(next, flipped)
    }

    /// Write `l` into the idle slot of `DENY_LENS` and flip to it.
    fn flip_lens(&mut self, act: &mut Active, word: u32, l: &DenyLens) -> Result<u32, LoadError> {
        act.settle();
        self.lens.set(idle(word), l, 0).on(maps::DENY_LENS)?;
        let word = word ^ active::LENS_SLOT;
        act.set(word, true)?;
        Ok(word)
    }

    /// The lengths in force.
    pub(crate) fn lens_in_force(&self, word: u32) -> Result<DenyLens, LoadError> {
        self.lens.get(&u32::from(word & active::LENS_SLOT != 0), 0).on(maps::DENY_LENS)
    }

    /// Every entry of `DENY` (networks and markers).
    pub(crate) fn entries(&self) -> Result<Vec<(DenyKey, u32)>, LoadError> {
        let mut out = Vec::new();
        rawmap::for_each_entry(self.deny.map(), |k, v| {
            let (Some(k), Some(v)) = (read_key(k), v.first_chunk::<4>()) else { return };
            out.push((k, u32::from_ne_bytes(*v)));
        })
        .map_err(io_error)?;
        Ok(out)
    }

    /// The origins' names, by index (empty: free).
    pub(crate) fn origins(&self) -> Result<Vec<String>, LoadError> {
        let mut names = Vec::new();
        for i in 0..crate::dataplane::deny::MAX_NAMED {
            let n = self.origins.get(&u32::try_from(i).unwrap_or(u32::MAX), 0).on(maps::DENY_ORIGINS)?;
            let end = n.bytes.iter().position(|b| *b == 0).unwrap_or(n.bytes.len());
            names.push(String::from_utf8_lossy(&n.bytes[..end]).into_owned());
        }
        while names.last().is_some_and(String::is_empty) {
            names.pop();
        }
        Ok(names)
    }

    /// Record the origins' names (cut to the map's 48 bytes).
    pub(crate) fn set_origins(&mut self, names: &[String]) -> Result<(), LoadError> {
        for (i, name) in (0u32..).zip(names) {
            let mut n = OriginName::default();
            let b = name.as_bytes();
            let len = b.len().min(n.bytes.len());
            n.bytes[..len].copy_from_slice(&b[..len]);
            if self.origins.get(&i, 0).on(maps::DENY_ORIGINS)? != n {
                self.origins.set(i, n, 0).on(maps::DENY_ORIGINS)?;
            }
        }
        Ok(())
    }
}

/// The idle `DENY_LENS` slot under `ACTIVE` = `word`.
fn idle(word: u32) -> u32 {
    u32::from(word & active::LENS_SLOT == 0)
}

fn key_bytes(k: &DenyKey) -> &[u8] {
    // SAFETY: DenyKey is repr(C), 20 bytes of integers, no padding.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(k).cast::<u8>(), size_of::<DenyKey>()) }
}

fn read_key(b: &[u8]) -> Option<DenyKey> {
    (b.len() == size_of::<DenyKey>()).then(|| {
        // SAFETY: as above; any 20 bytes are a DenyKey.
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<DenyKey>()) }
    })
}

fn io_error(io_error: std::io::Error) -> LoadError {
    let source = aya::maps::MapError::SyscallError(aya::sys::SyscallError { call: "bpf_map_batch", io_error });
    LoadError::Map { map: maps::DENY, source }
}
