//! The backends' health checks: one task per backend connects over TCP
//! each interval (with the check's timeout) and sends each result; the
//! feature counts them into rise and fall streaks once a second. The
//! connect also keeps the backend's next hop resolved, which the program
//! cannot do (XDP sends to a neighbour it finds, or drops); a backend
//! without checks gets a datagram to its discard port each interval for
//! that alone.

use std::{net::SocketAddr, time::Duration};

use tokio::{sync::mpsc, task::JoinHandle};

/// Results waiting for the feature's tick, at most (a tick drains them;
/// a full channel drops the newest, which the next interval repeats).
const ROOM: usize = 4096;

/// One result: the backend's global index, whether it connected, and
/// why not.
#[derive(Debug)]
pub struct Probe {
    pub index: u32,
    pub ok: bool,
    pub error: Option<String>,
}

/// The running checks; dropped, they stop.
#[derive(Debug)]
pub struct Checks {
    tasks: Vec<JoinHandle<()>>,
    pub results: mpsc::Receiver<Probe>,
}

impl Drop for Checks {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

/// One backend to check: its index, the address to connect to, the
/// interval and timeout; `check` false: only keep its next hop resolved.
pub type Target = (u32, SocketAddr, Duration, Duration, bool);

/// Start a check of each target every `interval`, each connect given
/// `timeout`.
#[must_use]
pub fn start(targets: Vec<Target>) -> Checks {
    let (tx, results) = mpsc::channel(ROOM);
    let tasks = targets
        .into_iter()
        .map(|(index, addr, interval, timeout, check)| {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(interval);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut socket = None;
                loop {
                    every.tick().await;
                    if !check {
                        touch(&mut socket, addr).await;
                        continue;
                    }
                    let (ok, error) = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                        Ok(Ok(_)) => (true, None),
                        Ok(Err(e)) => (false, Some(e.to_string())),
                        Err(_) => (false, Some(format!("no answer in {timeout:?}"))),
                    };
                    if tx.try_send(Probe { index, ok, error }).is_err() && tx.is_closed() {
                        return;
                    }
                }
            })
        })
        .collect();
    Checks { tasks, results }
}

/// A datagram to the backend's discard port (9): the kernel resolves the
/// next hop on the way. One socket a backend, bound at the first touch;
/// errors are of no interest.
async fn touch(socket: &mut Option<tokio::net::UdpSocket>, addr: SocketAddr) {
    if socket.is_none() {
        let any: SocketAddr =
            if addr.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        *socket = tokio::net::UdpSocket::bind(any).await.ok();
    }
    if let Some(s) = socket {
        let _ = s.send_to(&[], SocketAddr::new(addr.ip(), 9)).await;
    }
}
