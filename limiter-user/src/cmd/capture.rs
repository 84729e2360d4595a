//! `limiter capture`: a tap on the daemon's copies of dropped frames (or
//! of a sample of passed ones), read every 100 ms, written as pcapng (a
//! file or standard output) or printed a line a frame, until `-c` frames
//! or Ctrl-C; the tap is closed on the way out (and the daemon closes one
//! left unread).

use std::{
    io::Write,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use crate::capture::{Filter, Frame, pcapng};
use crate::control::{Request, client::Client};

/// How often the tap is read while it has nothing.
const POLL: Duration = Duration::from_millis(100);

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Where the frames go.
enum Out {
    Pcap(pcapng::Writer<Box<dyn Write>>),
    Lines,
}

pub fn capture(client: &Client, filter: Filter, write: Option<&Path>, count: Option<u64>) -> anyhow::Result<()> {
    let sink: Option<Box<dyn Write>> = match write {
        None => None,
        Some(p) if p == Path::new("-") => Some(Box::new(std::io::stdout().lock())),
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
            Some(Box::new(std::io::BufWriter::new(f)))
        }
    };
    let mut out = match sink {
        None => Out::Lines,
        Some(w) => Out::Pcap(pcapng::Writer::new(w)?),
    };
    let opened = client.capture(&Request::CaptureOpen { filter })?;
    let id = opened.id;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let (mut got, mut lost) = (0u64, 0u64);
    let result = (|| -> anyhow::Result<()> {
        while !STOP.load(Ordering::Relaxed) {
            let batch = client.capture(&Request::CaptureRead { id })?;
            lost += batch.lost;
            for f in batch.frames.iter().filter_map(crate::control::WireFrame::frame) {
                if count.is_some_and(|c| got >= c) {
                    break;
                }
                let written = match &mut out {
                    Out::Pcap(w) => w.write(&f, &batch.class_names),
                    Out::Lines => writeln!(std::io::stdout(), "{}", line(&f, &batch.class_names)),
                };
                match written {
                    Ok(()) => got += 1,
                    // The reader went away (`| head`): done.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
            if let Out::Pcap(w) = &mut out {
                match w.flush() {
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    r => r?,
                }
            }
            if count.is_some_and(|c| got >= c) {
                return Ok(());
            }
            if batch.frames.is_empty() {
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    })();
    let _ = client.capture(&Request::CaptureClose { id });
    eprintln!(
        "limiter: {got} frames captured{}",
        if lost > 0 { format!(", {lost} lost (read too slowly)") } else { String::new() }
    );
    result
}

/// One frame as a line: time, source, protocol and ports, length,
/// verdict, reason, class.
fn line(f: &Frame, class_names: &[String]) -> String {
    let micros = (f.t_ns % 1_000_000_000) / 1_000;
    let time = format!("{}.{micros:06}", crate::clock::human::clock(f.t_ns / 1_000_000_000));
    let what = match f.source() {
        Some(s) => {
            let ports = if s.port_known == 1 { format!(" {} > {}", s.sport, s.dport) } else { String::new() };
            format!("{} {}{ports}", s.ip(), crate::capture::protocol(s.proto))
        }
        None => "(not IP)".to_owned(),
    };
    format!("{time} {what} len {} {}", f.len, pcapng::comment(f, class_names))
}
