//! One module per verb of the `limiter` command, each with one entry
//! function. Human tables by default, one JSON document with `--json`.

mod attacks;
mod backend;
mod capture;
mod explain;
mod fleet;
mod generate;
mod history;
pub mod paint;
mod policy;
mod prefix;
mod replay;
mod run;
mod stats;
mod status;
mod table;
mod top;
mod unload;
mod upstream;

use std::path::{Path, PathBuf};

use crate::clock::human;

use crate::{
    cli::{Cli, Command},
    control::{DEFAULT_SOCKET, client::Client},
};

/// Carry out the command line.
pub fn dispatch(cli: &Cli) -> anyhow::Result<()> {
    paint::init(cli.color, cli.json);
    if let Command::Run(args) = &cli.command {
        return run::run(args, cli.socket.as_deref().unwrap_or(Path::new(DEFAULT_SOCKET)));
    }
    let socket = match &cli.socket {
        Some(given) => given.clone(),
        None => default_socket(Path::new(DEFAULT_SOCKET))?,
    };
    let (json, client) = (cli.json, Client::new(&socket));
    match &cli.command {
        Command::Run(_) => unreachable!("handled above"),
        Command::Unload(args) => unload::unload(args, json),
        Command::Status { watch: every } => watch(*every, json, || status::status(client, json)),
        Command::Stats { all, watch: every } => watch(*every, json, || stats::stats(client, json, *all)),
        Command::Policy(cmd) => policy::policy(cmd, client, json),
        Command::Prefix(cmd) => prefix::prefix(cmd, client, json),
        Command::Fleet(crate::cli::FleetCommand::Status) => fleet::status(client, json),
        Command::Upstream(cmd) => upstream::upstream(cmd, client, json),
        Command::Backend(cmd) => backend::backend(cmd, client, json),
        Command::Top { once, count, interval } => top::top(client, json, *once, *count, *interval),
        Command::Explain { addr, protocol, port, syn } => explain::explain(client, *addr, *protocol, *port, *syn, json),
        Command::History { since, count } => history::history(client, *since, *count, json),
        Command::Attacks { show, count } => attacks::attacks(client, show.as_ref(), *count, json),
        Command::Capture { write, reason, prefix, class, passed, count } => {
            let filter = crate::capture::Filter {
                reason: reason.clone(),
                prefix: *prefix,
                class: class.clone(),
                passed: *passed,
            };
            capture::capture(&client, filter, write.as_deref(), *count)
        }
        Command::Replay { pcap, policy } => replay::replay(pcap, policy.as_deref(), json),
        Command::Completions { shell } => {
            generate::completions(*shell);
            Ok(())
        }
        Command::Man { policy: true, .. } => {
            print!("{}", generate::policy_page());
            Ok(())
        }
        Command::Man { dir, .. } => generate::man(dir.as_deref()),
    }
}

/// The socket a verb talks to when `--socket` is not given: `default` if
/// it exists; else, when a service `limiter@IFACE` runs (its socket is
/// `/run/limiter/IFACE.sock`, beside `default`), the only one there; with
/// several, an error that names them.
fn default_socket(default: &Path) -> anyhow::Result<PathBuf> {
    if default.exists() {
        return Ok(default.to_owned());
    }
    let dir = default.parent().unwrap_or(Path::new("/"));
    let found = entries(dir, |name| Path::new(name).extension().is_some_and(|e| e == "sock"), 64);
    only_one(found, default, "several daemons run here", "--socket")
}

/// Up to `limit` paths in `dir` whose file names `name_ok` takes (none if
/// `dir` cannot be read).
fn entries(dir: &Path, name_ok: impl Fn(&str) -> bool, limit: usize) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| name_ok(&e.file_name().to_string_lossy()))
                .map(|e| e.path())
                .take(limit)
                .collect()
        })
        .unwrap_or_default()
}

/// `default` when nothing was `found`, the one path found, or with
/// several an error that names them and the flag that picks one.
fn only_one(mut found: Vec<PathBuf>, default: &Path, several: &str, flag: &str) -> anyhow::Result<PathBuf> {
    found.sort();
    match found.len() {
        0 => Ok(default.to_owned()),
        1 => Ok(found.swap_remove(0)),
        _ => {
            let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
            anyhow::bail!("{several} ({}): pick one with {flag}", names.join(", "))
        }
    }
}

/// Run `show` once, or with `every` seconds again and again until
/// interrupted (or an error): on a terminal each view replaces the last,
/// into a pipe they follow one another (with -j, one JSON document each).
fn watch(every: Option<f64>, json: bool, mut show: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let Some(every) = every else { return show() };
    let clear = !json && std::io::stdout().is_terminal();
    loop {
        if clear {
            print!("\x1b[H\x1b[2J"); // home, clear screen
        }
        show()?;
        let _ = std::io::Write::flush(&mut std::io::stdout());
        std::thread::sleep(std::time::Duration::from_secs_f64(every));
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::default_socket;

    #[test]
    fn the_default_socket_or_the_only_service_socket_beside_it() {
        let dir = std::env::temp_dir().join(format!("limiter-sockets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let default = dir.join("limiter.sock");
        // Nothing there: the default (whose error then names it).
        assert_eq!(default_socket(&default).unwrap(), default);
        std::fs::write(dir.join("eth0.sock"), "").unwrap();
        std::fs::write(dir.join("eth0.sock.lock"), "").unwrap();
        assert_eq!(default_socket(&default).unwrap(), dir.join("eth0.sock"));
        std::fs::write(dir.join("eth1.sock"), "").unwrap();
        let err = default_socket(&default).unwrap_err().to_string();
        assert!(err.contains("eth0.sock") && err.contains("eth1.sock") && err.contains("--socket"), "{err}");
        std::fs::write(&default, "").unwrap();
        assert_eq!(default_socket(&default).unwrap(), default);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
