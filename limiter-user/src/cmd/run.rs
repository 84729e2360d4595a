//! `limiter run`: the daemon, until SIGINT or SIGTERM.

use std::{path::Path, time::Duration};

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    cli::RunArgs,
    daemon::{Daemon, Settings, init_logging},
};

pub fn run(args: &RunArgs, socket: &Path) -> anyhow::Result<()> {
    init_logging(args.log_json);
    let settings = settings(args, socket)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let done = rt.block_on(async {
        // Handlers first: a signal that arrives during start-up is then
        // handled (cleanly, once the loop runs) instead of killing the process.
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let daemon = Box::pin(Daemon::start(settings)).await?;
        // On the heap: the daemon's state is large for a future.
        Box::pin(daemon.run(async move {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }))
        .await
    });
    // Stopping never waits on a reader: a file that is still being read
    // (a group's database, a feed) is left to the process's end, not
    // waited for as dropping the runtime would.
    rt.shutdown_timeout(SHUTDOWN_WAIT);
    done
}

/// How long a stop waits for work off the loop that is still running.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(500);

fn settings(args: &RunArgs, socket: &Path) -> anyhow::Result<Settings> {
    let metrics = match args.metrics.as_str() {
        "off" => None,
        a => Some(a.parse().map_err(|e| anyhow::anyhow!("--metrics {a:?}: {e}"))?),
    };
    Ok(Settings {
        iface: args.iface.clone(),
        mode: args.mode,
        attach: args.attach,
        priority: args.priority,
        pin_dir: args.pin.then(|| args.pin_dir.clone()),
        socket: socket.to_path_buf(),
        socket_group: args.socket_group.clone(),
        metrics,
        status_interval: (args.status_interval > 0.0).then(|| Duration::from_secs_f64(args.status_interval)),
        policy: args.policy.clone(),
        overlay: args.overlay.clone(),
        history: args.history.clone(),
        attacks: args.attacks.clone(),
    })
}
