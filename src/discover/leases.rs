//! The VNet DNS servers as DHCP offered them: the `DNS=` lines of systemd-networkd's lease files
//! (`/run/systemd/netif/leases/<ifindex>`).
//!
//! resolv.conf names only `169.254.10.10` while LocalDNS's networkd drop-in (`DNS=169.254.10.10`,
//! `UseDNS=false`) is in place, and for a moment after LocalDNS removed it (its `networkctl
//! reload` lands late): exactly when the fallback takes over. networkd writes the lease as the
//! DHCP server sent it, whatever `UseDNS=` says, so the lease still names the VNet DNS then.
//! resolv.conf stays the first source (it holds what the node is configured to use, static
//! servers included); the leases stand in while it lists nothing usable.
//!
//! The file is networkd's own key=value state, the same shape from systemd 2xx through 257
//! (`sd-dhcp-lease.c`, `dhcp_lease_save`):
//!
//! ```text
//! # This is private data. Do not parse.
//! ADDRESS=10.224.0.4
//! NETMASK=255.255.0.0
//! ROUTER=10.224.0.1
//! SERVER_ADDRESS=168.63.129.16
//! DNS=168.63.129.16
//! DOMAINNAME=abc123.bx.internal.cloudapp.net
//! ```
//!
//! Only `DNS=` is read, defensively: anything else, or a file that is not of that shape, yields
//! nothing rather than an error.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::resolv_conf::usable;

pub const DEFAULT_DIR: &str = "/run/systemd/netif/leases";

/// The servers of one lease file's `DNS=` line, in order, without loopback, unspecified or our
/// own listener addresses (`skip`): forwarding to those would loop back to us.
pub fn parse(text: &str, skip: &[IpAddr]) -> Vec<SocketAddr> {
    let values = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("DNS="));
    // networkd writes the addresses bare; an env-file reader would also take them quoted.
    let words = values.flat_map(|value| value.trim().trim_matches(['"', '\'']).split_whitespace());
    let ips = words.filter_map(|word| word.parse::<IpAddr>().ok());
    usable(ips.map(|ip| SocketAddr::new(ip, 53)), skip)
}

/// Every lease file in `dir` (files named by an interface index, in index order), their servers
/// together without duplicates. A directory without leases is `Ok` and empty; one that cannot
/// be read is an error sentence naming it.
pub fn read(dir: &Path, skip: &[IpAddr]) -> Result<Vec<SocketAddr>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files: Vec<(u32, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let index = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((index, e.path()))
        })
        .collect();
    files.sort();
    // A lease may be replaced or removed between the listing and the read: skip it.
    let texts = files
        .iter()
        .filter_map(|(_, path)| std::fs::read_to_string(path).ok());
    Ok(super::unique(texts.flat_map(|text| parse(&text, skip))))
}

/// The VNet DNS servers of the leases in `dir` (`None`: `--dhcp-leases none`) and where they
/// were found, or why there are none.
pub fn servers(dir: Option<&Path>, skip: &[IpAddr]) -> Result<(Vec<SocketAddr>, String), String> {
    let dir = dir.ok_or("the DHCP leases are not used (--dhcp-leases none)")?;
    match read(dir, skip)? {
        none if none.is_empty() => Err(format!("{} name no DNS server either", dir.display())),
        servers => Ok((servers, format!("DHCP leases {}", dir.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::resolv_conf::testing::{LISTENERS, parsed};
    use super::*;

    /// An AKS node's eth0 lease as systemd-networkd 255 writes it (Ubuntu 24.04), addresses
    /// changed.
    const AZURE_LEASE: &str = "\
# This is private data. Do not parse.
ADDRESS=10.224.0.4
NETMASK=255.255.0.0
ROUTER=10.224.0.1
SERVER_ADDRESS=168.63.129.16
NEXT_SERVER=168.63.129.16
BROADCAST=10.224.255.255
T1=2h 15min
T2=3h 56min 15s
LIFETIME=4h 30min
DNS=168.63.129.16
DOMAINNAME=abc123xyz.bx.internal.cloudapp.net
CLASSLESS_ROUTES=168.63.129.16/32,10.224.0.1 169.254.169.254/32,10.224.0.1 0.0.0.0/0,10.224.0.1
CLIENTID=ff0d2f3b5a000200001a2b3c4d5e6f7a8b9c
OPTION_245=a83f8110
";

    fn addrs(text: &str) -> Vec<String> {
        parsed(parse, text)
    }

    #[test]
    fn reads_an_azure_lease() {
        assert_eq!(addrs(AZURE_LEASE), ["168.63.129.16:53"]);
    }

    #[test]
    fn custom_vnet_dns_servers_in_order() {
        let lease = "ADDRESS=10.1.0.4\nDNS=10.1.0.53 10.1.0.54 10.1.0.53\nNTP=10.1.0.1\n";
        assert_eq!(addrs(lease), ["10.1.0.53:53", "10.1.0.54:53"]);
    }

    #[test]
    fn never_our_listeners_loopback_or_junk() {
        let lease = "DNS=169.254.10.10 127.0.0.53 0.0.0.0 not-an-ip 10.0.0.2\n\
                     # DNS=10.9.9.9\nSERVER_ADDRESS=10.0.0.3\nXDNS=10.0.0.4\n\u{0}\u{ff}\n";
        assert_eq!(addrs(lease), ["10.0.0.2:53"]);
    }

    #[test]
    fn a_lease_without_servers_or_a_foreign_file_lists_nothing() {
        assert!(addrs("# This is private data. Do not parse.\nADDRESS=10.0.0.4\n").is_empty());
        assert!(addrs("{\"Address\": [10, 0, 0, 4]}").is_empty());
        assert!(addrs("").is_empty());
    }

    #[test]
    fn every_lease_of_the_directory_in_interface_order() {
        let dir = std::env::temp_dir().join(format!("leases-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("12"), "DNS=10.0.12.53 168.63.129.16\n").unwrap();
        std::fs::write(dir.join("2"), AZURE_LEASE).unwrap();
        // Not a lease: networkd's temporary files and anything else not named by an index.
        std::fs::write(dir.join(".#2abcdef"), "DNS=10.6.6.6\n").unwrap();
        std::fs::write(dir.join("README"), "DNS=10.7.7.7\n").unwrap();
        let found: Vec<String> = read(&dir, &LISTENERS)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found, ["168.63.129.16:53", "10.0.12.53:53"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(read(&dir, &LISTENERS).unwrap_err().contains("cannot read"));
    }
}
