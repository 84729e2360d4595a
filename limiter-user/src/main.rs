//! `limiter`: the daemon and operator command of the XDP flood guard.

use limiter::{
    cli::{self, Command},
    verbs,
};

fn main() -> std::process::ExitCode {
    let cli = cli::parse();
    let (json, socket) = (cli.json, cli.socket.as_path());
    let res = match &cli.command {
        Command::Run(args) => {
            limiter::run::init_logging(args.log_json);
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(limiter::run::run(args, socket)),
                Err(e) => Err(anyhow::Error::from(e).context("starting the runtime")),
            }
        }
        Command::Unload(args) => verbs::unload(args, json),
        Command::Status => verbs::status(socket, json),
        Command::Stats => verbs::stats(socket, json),
        Command::Policy(cmd) => verbs::policy(cmd, socket, json),
        Command::Prefix(cmd) => verbs::prefix(cmd, socket, json),
        Command::Top { once, count, interval } => verbs::top(socket, json, *once, *count, *interval),
        Command::Replay { pcap, policy } => verbs::replay(pcap, policy.as_deref(), json),
        Command::Completions { shell } => {
            verbs::completions(*shell);
            Ok(())
        }
        Command::Man => verbs::man(),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            eprintln!("limiter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
