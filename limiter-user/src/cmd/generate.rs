//! `limiter completions SHELL` and `limiter man`.

use clap::CommandFactory as _;

use crate::cli::Cli;

pub fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "limiter", &mut std::io::stdout());
}

pub fn man() -> anyhow::Result<()> {
    clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
    Ok(())
}
