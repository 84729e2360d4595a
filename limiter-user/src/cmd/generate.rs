//! `limiter completions SHELL` and `limiter man`.

use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cli::Cli;

pub fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "limiter", &mut std::io::stdout());
}

/// The manual section of every page: 8, system administration, as
/// Debian files the commands it installs in `/usr/sbin`.
pub const MAN_SECTION: &str = "8";

/// limiter(8) on stdout, or every page (one per verb and sub-verb, named
/// as `man` looks them up: `limiter-policy-check.8`) written into `dir`.
pub fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    match dir {
        None => clap_mangen::Man::new(cmd).section(MAN_SECTION).render(&mut std::io::stdout())?,
        Some(dir) => {
            cmd.build();
            write_pages(cmd, dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
    }
    Ok(())
}

/// `clap_mangen::generate_to`, which only writes section 1, in section 8.
fn write_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        write_pages(sub, dir)?;
    }
    clap_mangen::Man::new(cmd).section(MAN_SECTION).generate_to(dir)?;
    Ok(())
}
