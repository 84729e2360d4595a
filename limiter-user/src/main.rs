//! `limiter`: the daemon and operator command of the XDP flood guard.

fn main() -> std::process::ExitCode {
    let cli = limiter::cli::parse();
    if !matches!(cli.command, limiter::cli::Command::Run(_)) {
        // An operator's verb writes to a terminal or a pipe: a reader that
        // goes (`limiter upstream list | head`) ends it quietly, as it
        // ends `ip` or `nft`, instead of a panic on EPIPE. The daemon
        // keeps Rust's default (SIGPIPE ignored): a client that hangs up
        // is an error on its socket, never the daemon's end.
        // SAFETY: setting a signal's disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match limiter::cmd::dispatch(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, outermost first; under
            // -j, as a JSON object on standard output, where the answer
            // would have been.
            limiter::cli::say_error(&format!("{e:#}"), cli.json);
            std::process::ExitCode::FAILURE
        }
    }
}
