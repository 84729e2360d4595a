//! `limiter`: the daemon and operator command of the XDP flood guard.

fn main() -> std::process::ExitCode {
    let cli = limiter::cli::parse();
    match limiter::cmd::dispatch(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            eprintln!("limiter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
