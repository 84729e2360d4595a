//! Counts by the variants of an enum: read and bumped by the variant, never
//! by a position, and listed with their variant. What crosses a room as a
//! counter is one of these, not an array whose order one must know.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

/// An enum whose variants are counted: all of them, in a fixed order.
pub trait Kinds<const N: usize>: Copy + PartialEq + 'static {
    const ALL: [Self; N];
}

/// A count per variant of `K`. On the wire (JSON) it is the counts in
/// `K::ALL`'s order, as the positional array it replaces was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts<K, const N: usize> {
    counts: [u64; N],
    kind: PhantomData<K>,
}

impl<K, const N: usize> Serialize for Counts<K, N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.counts.as_slice().serialize(s)
    }
}

impl<'de, K, const N: usize> Deserialize<'de> for Counts<K, N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<u64>::deserialize(d)?;
        let counts = <[u64; N]>::try_from(v)
            .map_err(|v| serde::de::Error::custom(format!("{} counts where {N} were expected", v.len())))?;
        Ok(Self { counts, kind: PhantomData })
    }
}

impl<K, const N: usize> Default for Counts<K, N> {
    fn default() -> Self {
        Self { counts: [0; N], kind: PhantomData }
    }
}

impl<K: Kinds<N>, const N: usize> Counts<K, N> {
    /// The count of `k`.
    #[must_use]
    pub fn get(&self, k: K) -> u64 {
        self.counts[Self::at(k)]
    }

    /// One more of `k`.
    pub fn bump(&mut self, k: K) {
        self.counts[Self::at(k)] += 1;
    }

    /// Every variant with its count, in `K::ALL`'s order.
    pub fn iter(&self) -> impl Iterator<Item = (K, u64)> + '_ {
        K::ALL.into_iter().zip(self.counts)
    }

    /// All counts together.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn at(k: K) -> usize {
        K::ALL.iter().position(|v| *v == k).expect("K::ALL holds every variant")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Color {
        Red,
        Green,
    }

    impl Kinds<2> for Color {
        const ALL: [Self; 2] = [Color::Red, Color::Green];
    }

    #[test]
    fn counts_are_kept_by_variant_and_sent_in_order() {
        let mut c = Counts::<Color, 2>::default();
        c.bump(Color::Green);
        c.bump(Color::Green);
        c.bump(Color::Red);
        assert_eq!((c.get(Color::Red), c.get(Color::Green), c.total()), (1, 2, 3));
        assert_eq!(c.iter().collect::<Vec<_>>(), [(Color::Red, 1), (Color::Green, 2)]);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, "[1,2]");
        assert_eq!(serde_json::from_str::<Counts<Color, 2>>(&json).unwrap(), c);
    }
}
