//! `limiter`: the daemon and operator command of the XDP flood guard.

use limiter::cli::{self, Command, PolicyCommand};

fn main() -> std::process::ExitCode {
    let cli = cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limiter: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async {
        match &cli.command {
            Command::Run(args) => limiter::run::run(args).await,
            Command::Unload(args) => limiter::run::unload(args),
            Command::Policy(PolicyCommand::Check { file }) => limiter::run::check(file),
        }
    });
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            eprintln!("limiter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
