//! The program's link to its interface: checked every second, put back
//! when lost (a link or a pin removed by someone else).

use crate::dataplane::{Attachment, DataPlane, Health};

/// The program's link to its interface, as last checked.
pub(super) struct Link {
    pub(super) attachment: Attachment,
    pub(super) health: Health,
    /// Times the daemon put back a lost link or pin.
    pub(super) repairs: u64,
}

impl Link {
    pub(super) fn new(attachment: Attachment) -> Self {
        Self { attachment, health: Health::Attached, repairs: 0 }
    }

    /// Once a second: is the program still on `iface` (and pinned)? If
    /// not, say so (metrics and status too) and put it back.
    pub(super) fn check(&mut self, dp: &mut DataPlane, iface: &str) {
        let health = self.attachment.health();
        if let Health::Detached(why) = &health {
            if self.health == Health::Attached {
                tracing::error!(event = "detached", iface = %iface, "limiter: NOT ENFORCING: {why}");
            }
            match dp.repair(&mut self.attachment) {
                Ok(done) => {
                    self.repairs += 1;
                    tracing::warn!(event = "reattached", iface = %iface, "limiter: {done}");
                    self.health = self.attachment.health();
                    return;
                }
                Err(e) if self.health == Health::Attached => {
                    let e = anyhow::Error::from(e);
                    tracing::error!("limiter: cannot attach again yet (retrying every second): {e:#}");
                }
                Err(_) => {}
            }
        }
        self.health = health;
    }
}
