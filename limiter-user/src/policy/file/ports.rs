//! Ports of a class: a number, or an inclusive `"low-high"` range.

use serde::{Deserialize, Serialize, de};

/// A port (`443`) or an inclusive range (`"8000-8080"`), checked as read.
#[derive(PartialEq)]
pub(super) struct PortSpec(pub u16, pub u16);

impl<'de> Deserialize<'de> for PortSpec {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = PortSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a port 1..=65535 or a \"low-high\" range")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<PortSpec, E> {
                let p = u16::try_from(n).ok().filter(|p| *p > 0).ok_or_else(|| E::custom(not_a_port(&n)))?;
                Ok(PortSpec(p, p))
            }
            fn visit_str<E: de::Error>(self, r: &str) -> Result<PortSpec, E> {
                let (a, b) =
                    r.split_once('-').ok_or_else(|| E::custom(format!("{r:?} is not a \"low-high\" range")))?;
                let num =
                    |x: &str| x.trim().parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| E::custom(not_a_port(&x)));
                let (lo, hi) = (num(a)?, num(b)?);
                if lo > hi {
                    return Err(E::custom(format!("range {lo}-{hi} is empty")));
                }
                Ok(PortSpec(lo, hi))
            }
        }
        d.deserialize_any(V)
    }
}

/// Written as read: a number, or `"low-high"`.
impl Serialize for PortSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == self.1 { s.serialize_u16(self.0) } else { s.serialize_str(&format!("{}-{}", self.0, self.1)) }
    }
}

fn not_a_port(v: &dyn std::fmt::Display) -> String {
    format!("{v} is not a port (1..=65535)")
}
