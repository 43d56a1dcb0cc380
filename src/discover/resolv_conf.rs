//! The VNet DNS servers: `nameserver` lines of systemd-resolved's upstream file
//! (`/run/systemd/resolve/resolv.conf`, not the stub in `/etc/resolv.conf`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::Path;
use std::time::SystemTime;

pub const DEFAULT_PATH: &str = "/run/systemd/resolve/resolv.conf";

/// The servers named in `text`, in order, without duplicates, without loopback stubs
/// (127.0.0.53, ::1) and without our own listener addresses (`skip`): forwarding to those would
/// loop straight back to us.
pub fn parse(text: &str, skip: &[IpAddr]) -> Vec<SocketAddr> {
    let servers = text.lines().filter_map(|line| {
        let line = line.split(['#', ';']).next().unwrap_or("");
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["nameserver", server, ..] => parse_server(server),
            _ => None,
        }
    });
    usable(servers, skip)
}

/// `servers` in order, each once, without those forwarding to which would loop back to us: a
/// loopback stub (127.0.0.53, ::1), the unspecified address, or one of our own listener
/// addresses (`skip`). Every VNet DNS source goes through this one loop guard.
pub fn usable(servers: impl IntoIterator<Item = SocketAddr>, skip: &[IpAddr]) -> Vec<SocketAddr> {
    let loops = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified() || skip.contains(&ip);
    super::unique(servers.into_iter().filter(|addr| !loops(addr.ip())))
}

/// `1.2.3.4`, `fd00::1` or a link-local `fe80::1%eth0` (the zone picks the interface).
fn parse_server(word: &str) -> Option<SocketAddr> {
    if let Ok(ip) = word.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 53));
    }
    let (ip, zone) = word.split_once('%')?;
    let ip: Ipv6Addr = ip.parse().ok()?;
    let scope = zone
        .parse::<u32>()
        .ok()
        .or_else(|| nix::net::if_::if_nametoindex(zone).ok())?;
    Some(SocketAddr::V6(SocketAddrV6::new(ip, 53, 0, scope)))
}

/// What identifies one version of the file without reading it: re-reading every second or two is
/// then a `stat` unless something changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

pub fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode: m.ino(),
    })
}

pub fn read(path: &Path, skip: &[IpAddr]) -> Result<Vec<SocketAddr>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(parse(&text, skip))
}

/// What the unit tests of every VNet DNS source share.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    /// The listener addresses, which the loop guard skips.
    pub const LISTENERS: [IpAddr; 2] = [
        IpAddr::V4(Ipv4Addr::new(169, 254, 10, 10)),
        IpAddr::V4(Ipv4Addr::new(169, 254, 10, 11)),
    ];

    /// The servers a source's `parse` finds in `text`, as strings.
    pub fn parsed(parse: fn(&str, &[IpAddr]) -> Vec<SocketAddr>, text: &str) -> Vec<String> {
        parse(text, &LISTENERS)
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::parsed;
    use super::*;

    fn addrs(text: &str) -> Vec<String> {
        parsed(parse, text)
    }

    #[test]
    fn reads_azure_shaped_files() {
        let file = "# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8).\n\
                    # Do not edit.\n\
                    nameserver 168.63.129.16\n\
                    search abc.internal.cloudapp.net\n";
        assert_eq!(addrs(file), ["168.63.129.16:53"]);
    }

    #[test]
    fn keeps_order_drops_duplicates_stubs_and_our_listeners() {
        let file = "nameserver 169.254.10.10\nnameserver 10.1.0.4\nnameserver 127.0.0.53\n\
                    nameserver ::1\nnameserver 10.1.0.5\nnameserver 10.1.0.4\nnameserver 169.254.10.11\n";
        assert_eq!(addrs(file), ["10.1.0.4:53", "10.1.0.5:53"]);
    }

    #[test]
    fn the_startup_race_file_lists_only_our_listener() {
        assert!(addrs("nameserver 169.254.10.10\nsearch x\n").is_empty());
    }

    #[test]
    fn a_stub_only_file_lists_nothing_usable() {
        assert!(addrs("nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n").is_empty());
        assert!(addrs("").is_empty());
    }

    #[test]
    fn ipv6_first_and_zones() {
        let file = "nameserver fd00::53\nnameserver 168.63.129.16\nnameserver fe80::1%1\n";
        assert_eq!(
            addrs(file),
            ["[fd00::53]:53", "168.63.129.16:53", "[fe80::1%1]:53"]
        );
    }

    #[test]
    fn tolerates_comments_options_and_junk() {
        let file = "; comment\n  nameserver   10.0.0.2   # trailing comment\noptions edns0 trust-ad\n\
                    nameserver\nnameserver not-an-ip\nnameserver 10.0.0.3;x\ngarbage line\n\u{0}\u{ff}\n\
                    nameserver fe80::1%no-such-interface\n";
        assert_eq!(addrs(file), ["10.0.0.2:53", "10.0.0.3:53"]);
    }
}
