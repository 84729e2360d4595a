//! Files the daemon and the command-line client read from a path an
//! operator (or an attacker) named: bounded before a byte is read.

use std::path::Path;

/// The text of `path` if it is a regular file of at most `max` bytes
/// (`what` names it in the error): a FIFO would block and a device
/// (`/dev/zero`) never end, so neither is read at all, and a file that
/// grows between the check and the read is cut at `max + 1` bytes and
/// refused. The daemon and the command-line client read files this way.
pub fn read_text(path: &Path, max: u64, what: &str) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("not a regular file (a FIFO or a device is never read as {what})"));
    }
    if meta.len() > max {
        return Err(format!("{} bytes, more than the {max} {what} may have", meta.len()));
    }
    let mut text = String::new();
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    std::io::Read::read_to_string(&mut std::io::Read::take(file, max + 1), &mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > max {
        return Err(format!("more than the {max} bytes {what} may have"));
    }
    Ok(text)
}
