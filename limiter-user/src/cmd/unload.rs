//! `limiter unload`: remove the pins; the link goes with its last pin.

use crate::{cli::UnloadArgs, dataplane::pin};

pub fn unload(args: &UnloadArgs, json: bool) -> anyhow::Result<()> {
    let removed = pin::unload_checked(&args.pin_dir, args.keep_maps, args.force)?;
    if json {
        let doc = serde_json::json!({ "pin_dir": args.pin_dir, "removed": removed, "kept_maps": args.keep_maps });
        return super::print_json(&doc);
    }
    if removed.is_empty() {
        println!("limiter: nothing pinned in {}", args.pin_dir.display());
    } else {
        println!("limiter: removed {} from {}", removed.join(", "), args.pin_dir.display());
    }
    Ok(())
}
