//! The node's hosts file (`--hosts-file`), which LocalDNS serves from its root blocks: read when
//! its stamp (inode, size, modification time) changes, so a new file renamed over the old one is
//! read too; while it is missing or unreadable the last content stays in force, as with CoreDNS's
//! hosts plugin, and a file that appears later is read then.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::resolv_conf::{self, Stamp};
use crate::hosts::{Hosts, MAX_FILE};

pub const DEFAULT_PATH: &str = "/etc/localdns/hosts";

/// Reads at most `MAX_FILE` bytes of the file (its first ones).
pub fn read(path: &Path) -> Result<Hosts, String> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_end(&mut text))
        .map_err(|e| format!("cannot read the hosts file {}: {e}", path.display()))?;
    let mut hosts = Hosts::parse(&text);
    hosts.read_at = Some(SystemTime::now());
    Ok(hosts)
}

/// Follows the file from the discovery loop.
#[derive(Default)]
pub struct Follower {
    path: Option<PathBuf>,
    stamp: Option<Stamp>,
    said: Option<String>,
}

impl Follower {
    pub fn new(path: Option<PathBuf>) -> Follower {
        Follower {
            path,
            ..Follower::default()
        }
    }

    /// A `stat`; the table read anew if the file changed since the last look.
    pub fn check(&mut self) -> Option<Hosts> {
        let path = self.path.as_ref()?;
        let stamp = resolv_conf::stamp(path);
        if stamp.is_some() && stamp == self.stamp {
            return None;
        }
        let read = match stamp {
            Some(_) => read(path),
            None => Err(format!("no hosts file at {}", path.display())),
        };
        self.stamp = stamp.filter(|_| read.is_ok());
        match read {
            Ok(hosts) => {
                tracing::info!(
                    path = %path.display(),
                    entries = hosts.len(),
                    lines_skipped = hosts.skipped,
                    "hosts file read"
                );
                self.said = None;
                Some(hosts)
            }
            Err(why) => {
                if self.said.as_ref() != Some(&why) {
                    tracing::info!("{why}; its last content (if any) is served meanwhile");
                    self.said = Some(why);
                }
                None
            }
        }
    }
}
