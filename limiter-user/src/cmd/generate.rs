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

/// The shipped policy file, every option shown at its default.
const SHIPPED_POLICY: &str = include_str!("../../../packaging/limiter.toml");

/// limiter.toml(5): the policy file's page, its body the shipped file
/// (every key, its default, the ranges its comments give), which the
/// tests hold to the parser.
#[must_use]
pub fn policy_page() -> String {
    let mut page = format!(
        ".TH LIMITER.TOML 5 \"\" \"limiter {}\" \"File Formats\"\n\
         .SH NAME\nlimiter.toml \\- the policy limiter(8) enforces\n\
         .SH SYNOPSIS\n/etc/limiter/limiter.toml\n\
         .SH DESCRIPTION\n\
         The policy of \\fBlimiter run\\fR: the default class's limits, up to seven classes \
         (token buckets or window quotas), prefix overrides, and the [[forward]], [feedback] \
         and [fleet] sections. \\fBlimiter policy check\\fR validates a file offline and names \
         the file, line and field of what is wrong; \\fBsystemctl reload limiter@IFACE\\fR or \
         \\fBlimiter policy apply\\fR makes it the next policy version, all or nothing.\n\
         .PP\nThe file as the package installs it follows: every option of every section, \
         commented out at its default (an example where it has none, marked e.g.).\n\
         .SH FILE\n.nf\n",
        env!("CARGO_PKG_VERSION")
    );
    for line in SHIPPED_POLICY.lines() {
        let line = line.replace('\\', "\\e");
        // A line starting with a dot or a quote would be a request.
        if line.starts_with(['.', '\'']) {
            page.push_str("\\&");
        }
        page.push_str(&line);
        page.push('\n');
    }
    page.push_str(
        ".fi\n.SH SEE ALSO\n\\fBlimiter\\fR(8), \\fBlimiter-run\\fR(8), \\fBlimiter-policy-check\\fR(8); \
         the policy reference, /usr/share/doc/limiter/policy.md.gz\n",
    );
    page
}
