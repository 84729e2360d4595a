//! One module per verb of the `limiter` command, each with one entry
//! function. Human tables by default, one JSON document with `--json`.

mod fleet;
mod generate;
mod policy;
mod prefix;
mod replay;
mod run;
mod stats;
mod status;
mod top;
mod unload;

use crate::{
    cli::{Cli, Command},
    control::client::Client,
};

/// Carry out the command line.
pub fn dispatch(cli: &Cli) -> anyhow::Result<()> {
    let (json, client) = (cli.json, Client::new(&cli.socket));
    match &cli.command {
        Command::Run(args) => run::run(args, &cli.socket),
        Command::Unload(args) => unload::unload(args, json),
        Command::Status => status::status(client, json),
        Command::Stats => stats::stats(client, json),
        Command::Policy(cmd) => policy::policy(cmd, client, json),
        Command::Prefix(cmd) => prefix::prefix(cmd, client, json),
        Command::Fleet(crate::cli::FleetCommand::Status) => fleet::status(client, json),
        Command::Top { once, count, interval } => top::top(client, json, *once, *count, *interval),
        Command::Replay { pcap, policy } => replay::replay(pcap, policy.as_deref(), json),
        Command::Completions { shell } => {
            generate::completions(*shell);
            Ok(())
        }
        Command::Man { dir } => generate::man(dir.as_deref()),
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
