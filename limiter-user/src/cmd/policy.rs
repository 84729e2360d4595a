//! `limiter policy check|apply|show`.

use anyhow::Context as _;

use crate::{
    cli::PolicyCommand,
    control::{Applied, Request, client::Client},
    policy::file,
};

pub fn policy(cmd: &PolicyCommand, client: Client, json: bool) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check { file } => {
            let loaded = file::read(file).context("invalid policy")?;
            loaded.check().context("invalid policy")?;
            let warnings = loaded.policy.warnings();
            for w in &warnings {
                eprintln!("warning: {w}");
            }
            let summary = loaded.policy.summary(0).body();
            if json {
                let doc = serde_json::json!({ "file": file, "valid": true, "summary": summary, "warnings": warnings });
                return super::print_json(&doc);
            }
            println!("{}: valid; {summary}", file.display());
            Ok(())
        }
        PolicyCommand::Apply { file, force } => {
            let force = *force;
            let req = match file {
                Some(f) => Request::PolicyApply {
                    force,
                    name: f.display().to_string(),
                    // The daemon's own checks, before anything is read.
                    text: Some(
                        file::read_text(f, file::MAX_FILE_BYTES, "a policy")
                            .map_err(|e| anyhow::anyhow!("reading {}: {e}", f.display()))?,
                    ),
                },
                None => Request::PolicyApply { name: String::new(), text: None, force },
            };
            print_applied(&client.change(&req)?, json)
        }
        PolicyCommand::Show => {
            let p = client.policy_show()?;
            if json {
                return super::print_json(
                    &serde_json::json!({ "version": p.version, "source": p.source, "policy": p.text }),
                );
            }
            print!("# policy v{}, from {}\n{}", p.version, p.source, p.text);
            Ok(())
        }
    }
}

/// What a policy change answers.
pub fn print_applied(a: &Applied, json: bool) -> anyhow::Result<()> {
    if json {
        return super::print_json(a);
    }
    println!("applied {}", a.summary);
    Ok(())
}
