//! `--priority`: the run priority of `limiter_chain` under a libxdp
//! dispatcher. libxdp reads it from the program's BTF, as the length of
//! the `priority` array of its run configuration (`_limiter_chain`, see
//! limiter-ebpf's `chain.rs`), and will not change it on a program already
//! loaded (`xdp_program__set_run_prio` refuses one it got from a
//! descriptor). So the object is given the priority before it is loaded:
//! that array type's element count in its `.BTF` section is rewritten.

/// The object a plan names, its run priority set: the embedded bytes, or
/// a copy with the priority written.
pub struct Object {
    original: &'static [u8],
    patched: Option<Vec<u64>>,
}

impl Object {
    #[must_use]
    pub fn of(plan: &super::kernel::Plan) -> Self {
        let original = plan.program.object();
        Self { original, patched: with_priority(original, plan.priority) }
    }

    /// The bytes to load.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.patched.as_deref().map_or(self.original, |b| bytes(b, self.original.len()))
    }
}

/// The object with the run configuration's priority set to `priority`;
/// `None` if it is that already, or holds no such configuration (an empty
/// object): the object is then loaded as it is.
#[must_use]
pub fn with_priority(object: &[u8], priority: u32) -> Option<Vec<u64>> {
    let at = nelems_offset(object)?;
    if u32_at(object, at) == Some(priority) {
        return None;
    }
    // A buffer of u64s: the ELF parser wants the object 8-aligned.
    let mut out = vec![0u64; object.len().div_ceil(8)];
    let bytes = as_bytes_mut(&mut out);
    bytes[..object.len()].copy_from_slice(object);
    bytes[at..at + 4].copy_from_slice(&priority.to_le_bytes());
    Some(out)
}

/// The object's bytes of a buffer made by [`with_priority`].
#[must_use]
pub fn bytes(buf: &[u64], len: usize) -> &[u8] {
    // SAFETY: u64s are plain bytes; `len` is at most the buffer's size.
    let all = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
    &all[..len.min(all.len())]
}

fn as_bytes_mut(buf: &mut [u64]) -> &mut [u8] {
    // SAFETY: as above; the borrow is the buffer's.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 8) }
}

fn u16_at(b: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?)))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn usize_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u32_at(b, at)?).ok()
}

fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// Where, in the object, the element count of the `priority` array of
/// the run configuration lies.
fn nelems_offset(elf: &[u8]) -> Option<usize> {
    let (btf, base) = section(elf, ".BTF")?;
    Some(base + array_nelems(btf)?)
}

/// The bytes of ELF64 (little-endian) section `name`, and their offset.
fn section<'a>(elf: &'a [u8], name: &str) -> Option<(&'a [u8], usize)> {
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(elf, 0x28)?, u16_at(elf, 0x3a)?, u16_at(elf, 0x3c)?, u16_at(elf, 0x3e)?);
    let header = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let strtab = u64_at(elf, header(shstrndx)? + 0x18)?;
    (0..shnum).find_map(|i| {
        let h = header(i)?;
        let name_at = strtab.checked_add(usize_at(elf, h)?)?;
        let found = elf.get(name_at..)?.split(|&c| c == 0).next()? == name.as_bytes();
        let (off, size) = (u64_at(elf, h + 0x18)?, u64_at(elf, h + 0x20)?);
        found.then(|| Some((elf.get(off..off.checked_add(size)?)?, off))).flatten()
    })
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// In a `.BTF` section: the offset of the element count of the array the
/// `priority` member of a struct that also has `XDP_PASS` points to.
fn array_nelems(btf: &[u8]) -> Option<usize> {
    if u16_at(btf, 0)? != 0xeb9f {
        return None;
    }
    let hdr = usize_at(btf, 4)?;
    let (type_off, type_len, str_off) = (usize_at(btf, 8)?, usize_at(btf, 12)?, usize_at(btf, 16)?);
    let types = hdr.checked_add(type_off)?;
    let strings = hdr.checked_add(str_off)?;
    let name = |off: u32| -> Option<&[u8]> {
        btf.get(strings.checked_add(usize::try_from(off).ok()?)?..)?.split(|&c| c == 0).next()
    };
    // Each type's offset, by id (ids from 1).
    let mut at = vec![0usize];
    let mut p = types;
    while p < types.checked_add(type_len)? {
        at.push(p);
        let info = u32_at(btf, p + 4)?;
        let (kind, vlen) = ((info >> 24) & 0x1f, usize::try_from(info & 0xffff).ok()?);
        p += 12
            + match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
    }
    let kind = |id: u32| Some((u32_at(btf, *at.get(usize::try_from(id).ok()?)? + 4)? >> 24) & 0x1f);
    for &t in &at[1..] {
        let info = u32_at(btf, t + 4)?;
        if (info >> 24) & 0x1f != KIND_STRUCT {
            continue;
        }
        let members: Vec<(Option<&[u8]>, u32)> = (0..usize::try_from(info & 0xffff).ok()?)
            .map(|i| Some((name(u32_at(btf, t + 12 + 12 * i)?), u32_at(btf, t + 16 + 12 * i)?)))
            .collect::<Option<_>>()?;
        if !members.iter().any(|(n, _)| *n == Some(b"XDP_PASS".as_slice())) {
            continue;
        }
        let Some(&(_, mut id)) = members.iter().find(|(n, _)| *n == Some(b"priority".as_slice())) else { continue };
        // Through the pointer (and any qualifier) to the array.
        for _ in 0..8 {
            match kind(id)? {
                KIND_ARRAY => return Some(*at.get(usize::try_from(id).ok()?)? + 12 + 8),
                KIND_PTR | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = u32_at(btf, *at.get(usize::try_from(id).ok()?)? + 8)?;
                }
                _ => break,
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_production_objects_run_priority_is_rewritten_and_still_parses() {
        for object in [super::super::OBJECT, super::super::OBJECT_WITHOUT_SYN_COOKIES] {
            if object.is_empty() {
                return; // LIMITER_BUILD_SKIP
            }
            let at = nelems_offset(object).expect("a run configuration");
            assert_eq!(u32_at(object, at), Some(limiter_common::RUN_PRIORITY_DEFAULT));
            let buf = with_priority(object, 20).unwrap();
            let patched = bytes(&buf, object.len());
            assert_eq!(u32_at(patched, at), Some(20));
            assert_eq!(patched.len(), object.len());
            assert_eq!(patched.iter().zip(object).filter(|(a, b)| a != b).count(), 1, "one byte changed");
            aya_obj::Object::parse(patched).expect("the patched object parses");
        }
        assert!(with_priority(b"not an object", 20).is_none());
    }
}
