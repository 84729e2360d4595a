//! Files the daemon and the command-line client read from a path an
//! operator (or an attacker) named: bounded before a byte is read.

use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("not a regular file (a FIFO or a device is never read as {what})")]
    NotAFile { what: &'static str },
    #[error("{len} bytes, more than the {max} {what} may have")]
    TooBig { len: u64, max: u64, what: &'static str },
    #[error("more than the {max} bytes {what} may have")]
    Grew { max: u64, what: &'static str },
}

/// The text of `path` if it is a regular file of at most `max` bytes
/// (`what` names it in the error): a FIFO would block and a device
/// (`/dev/zero`) never end, so neither is read at all, and a file that
/// grows between the check and the read is cut at `max + 1` bytes and
/// refused. The daemon and the command-line client read files this way.
pub fn read_text(path: &Path, max: u64, what: &'static str) -> Result<String, ReadError> {
    read_text_and_metadata(path, max, what).map(|(text, _)| text)
}

/// [`read_text`], with the metadata of the file that was read. The file
/// is opened first (non-blocking, so a FIFO swapped in cannot hold the
/// open) and the checks are made on the opened descriptor: a path
/// checked, then swapped for a FIFO or a device before the open, is
/// never read (that race won 6% of the time against a stat of the path).
pub fn read_text_and_metadata(
    path: &Path,
    max: u64,
    what: &'static str,
) -> Result<(String, std::fs::Metadata), ReadError> {
    let (bytes, meta) = read_bytes(path, max, what)?;
    let text = String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((text, meta))
}

/// The bytes of `path`, read as [`read_text_and_metadata`] reads text
/// (a binary database, an `.mmdb`).
pub fn read_bytes(path: &Path, max: u64, what: &'static str) -> Result<(Vec<u8>, std::fs::Metadata), ReadError> {
    read_bytes_with(path, max, what, 0)
}

/// [`read_bytes`], opened with `flags` too (`O_NOFOLLOW`: a file the
/// daemon writes itself, where a link is never its own).
pub fn read_bytes_with(
    path: &Path,
    max: u64,
    what: &'static str,
    flags: i32,
) -> Result<(Vec<u8>, std::fs::Metadata), ReadError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | flags).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile { what });
    }
    if meta.len() > max {
        return Err(ReadError::TooBig { len: meta.len(), max, what });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::io::Read::read_to_end(&mut std::io::Read::take(file, max + 1), &mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::Grew { max, what });
    }
    Ok((bytes, meta))
}
