//! `limiter completions SHELL` and `limiter man`.

use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::Cli;

pub fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "limiter", &mut std::io::stdout());
}

/// limiter(1) on stdout, or every page (one per verb and sub-verb, named
/// as `man` looks them up: `limiter-policy-check.1`) written into `dir`.
pub fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    let cmd = Cli::command().disable_help_subcommand(true);
    match dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
        Some(dir) => {
            clap_mangen::generate_to(cmd, dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
    }
    Ok(())
}
