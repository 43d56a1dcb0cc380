//! The node's hosts file as CoreDNS's hosts plugin reads it (`IP name [aliases...]`, `#`
//! comments): parsed from bytes into an immutable table, looked up by name or by address. The
//! shell reads the file; the engine decides with the table (`engine::route`).
//!
//! As the plugin does: an address may carry a zone (`fe80::1%eth0`, the zone ignored); an
//! IPv4-mapped IPv6 address is an IPv4 one (an A record); a name on several lines has every
//! line's addresses; names are case-insensitive. Unlike it, a (name, address) pair given twice
//! is one record, not two.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire;

/// At most this many (name, address) records are kept; the rest of the file is skipped and
/// counted. Each costs about 75 bytes (two 24-byte index entries, its name, its filter bits:
/// 3.6 MiB measured for 50,000 lines), so the table stays under 16 MiB whatever the file holds;
/// the shell reads at most `MAX_FILE` bytes of it.
pub const MAX_ENTRIES: usize = 200_000;
/// The most of the file that is read: the node's file holds a few dozen lines.
pub const MAX_FILE: u64 = 8 << 20;

/// A record: its name (offset and length in `Hosts::names`) and its address.
type Rec = (u32, u8, IpAddr);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hosts {
    /// Lower-case wire names, back to back.
    names: Vec<u8>,
    /// Sorted by name, then address: one binary search finds a name's records.
    by_name: Vec<Rec>,
    /// Sorted by address, then name.
    by_addr: Vec<Rec>,
    /// A bit per name's hash, 16 bits per record: a name absent from the file (every forwarded
    /// query's) costs a hash and one load, not a binary search (0.3-0.7 µs with 50,000 lines).
    filter: Vec<u64>,
    /// Lines with something that could not be used: no address, no name, a malformed name, or
    /// records past the cap.
    pub skipped: usize,
    /// When the shell read it.
    pub read_at: Option<std::time::SystemTime>,
}

impl Hosts {
    pub fn parse(text: &[u8]) -> Hosts {
        let mut hosts = Hosts::default();
        for line in text.split(|&b| b == b'\n') {
            let line = line.split(|&b| b == b'#').next().unwrap_or_default();
            let mut fields = line
                .split(u8::is_ascii_whitespace)
                .filter(|f| !f.is_empty());
            let Some(first) = fields.next() else {
                continue;
            };
            let addr = first.split(|&b| b == b'%').next().unwrap_or_default();
            let addr = std::str::from_utf8(addr).ok().and_then(|a| a.parse().ok());
            let Some(addr) = addr.map(|a: IpAddr| a.to_canonical()) else {
                hosts.skipped += 1;
                continue;
            };
            let mut good = false;
            let mut bad = false;
            for name in fields {
                let wire = std::str::from_utf8(name).map(wire::encode_name);
                match wire {
                    Ok(Ok(wire)) if wire.len() > 1 && hosts.by_name.len() < MAX_ENTRIES => {
                        let at = hosts.names.len() as u32;
                        hosts.names.extend_from_slice(&wire);
                        hosts.by_name.push((at, wire.len() as u8, addr));
                        good = true;
                    }
                    _ => bad = true,
                }
            }
            hosts.skipped += usize::from(bad || !good);
        }
        let mut by_name = std::mem::take(&mut hosts.by_name);
        by_name.sort_unstable_by(|a, b| (hosts.name(a), a.2).cmp(&(hosts.name(b), b.2)));
        by_name.dedup_by(|a, b| (hosts.name(a), a.2) == (hosts.name(b), b.2));
        let mut by_addr = by_name.clone();
        by_addr.sort_by_key(|r| r.2);
        hosts.filter = vec![0; (by_name.len() * 16).next_power_of_two().max(64) / 64];
        for r in &by_name {
            let (word, bit) = hosts.bit(hosts.name(r));
            hosts.filter[word] |= bit;
        }
        hosts.by_name = by_name;
        hosts.by_addr = by_addr;
        hosts
    }

    /// Where a (lower-case) name's bit is in `filter`.
    fn bit(&self, name: &[u8]) -> (usize, u64) {
        let h = foldhash::fast::FixedState::with_seed(0).hash_one(name) as usize;
        ((h >> 6) % self.filter.len().max(1), 1 << (h & 63))
    }

    fn name(&self, r: &Rec) -> &[u8] {
        &self.names[r.0 as usize..r.0 as usize + usize::from(r.1)]
    }

    /// (name, address) records.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The addresses of `name` (wire form, any case), in order; none if the file lacks it.
    pub fn addrs(&self, name: &[u8]) -> impl Iterator<Item = IpAddr> + '_ {
        let mut lower = [0u8; 256];
        let key = &mut lower[..name.len().min(256)];
        key.copy_from_slice(&name[..key.len()]);
        key.make_ascii_lowercase();
        let (word, bit) = self.bit(key);
        let absent = self.filter.get(word).is_none_or(|w| w & bit == 0);
        let from = if absent {
            self.by_name.len()
        } else {
            self.by_name.partition_point(|r| self.name(r) < &*key)
        };
        let to = from + self.by_name[from..].partition_point(|r| self.name(r) == &*key);
        self.by_name[from..to].iter().map(|r| r.2)
    }

    /// The names (lower-case wire form) that have `addr`, in order.
    pub fn names(&self, addr: IpAddr) -> impl Iterator<Item = &[u8]> {
        let from = self.by_addr.partition_point(|r| r.2 < addr);
        self.by_addr[from..]
            .iter()
            .take_while(move |r| r.2 == addr)
            .map(|r| self.name(r))
    }
}

/// The address a reverse name stands for: `d.c.b.a.in-addr.arpa` (four decimal labels) or
/// `ip6.arpa` with 32 nibble labels; `None` for any other name. No allocation: every PTR query
/// forwarded while the node has a hosts file asks this.
pub fn reverse(name: &[u8]) -> Option<IpAddr> {
    let mut labels: [&[u8]; 34] = [&[]; 34];
    let (mut n, mut at) = (0, 0);
    while let Some(&len) = name.get(at).filter(|&&l| l != 0) {
        *labels.get_mut(n)? = name.get(at + 1..at + 1 + usize::from(len))?;
        (n, at) = (n + 1, at + 1 + usize::from(len));
    }
    let (labels, [kind, arpa]) = labels[..n].split_last_chunk::<2>()?;
    if !arpa.eq_ignore_ascii_case(b"arpa") {
        return None;
    }
    if kind.eq_ignore_ascii_case(b"in-addr") && labels.len() == 4 {
        // As text, so that the address is read as strictly as anywhere else (no leading zeros).
        let mut text = [0u8; 4 * 64];
        let mut len = 0;
        for (i, label) in labels.iter().rev().enumerate() {
            if i > 0 {
                text[len] = b'.';
                len += 1;
            }
            text[len..len + label.len()].copy_from_slice(label);
            len += label.len();
        }
        let text = std::str::from_utf8(&text[..len]).ok()?;
        return text.parse::<Ipv4Addr>().ok().map(IpAddr::V4);
    }
    if !kind.eq_ignore_ascii_case(b"ip6") || labels.len() != 32 {
        return None;
    }
    let mut bits = 0u128;
    for nibble in labels.iter().rev() {
        let digit = match nibble {
            [d] => char::from(*d).to_digit(16)?,
            _ => return None,
        };
        bits = bits << 4 | u128::from(digit);
    }
    Some(IpAddr::V6(Ipv6Addr::from(bits)).to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Vec<u8> {
        wire::encode_name(s).unwrap()
    }

    #[test]
    fn reads_as_the_hosts_plugin_does() {
        let h = Hosts::parse(
            b"# comment\n\n10.0.0.1 a.example B.example # an alias, then a comment\n\
              fe80::1%eth0 a.example\n::ffff:10.0.0.2 a.example\n10.0.0.1 a.example\n\
              not-an-address x.example\n10.0.0.3\n10.0.0.4 ok.example bad..example\n\
              \t 10.0.0.5\tTAB.example\r\n",
        );
        let addrs = |n: &str| h.addrs(&name(n)).map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(addrs("A.EXAMPLE"), ["10.0.0.1", "10.0.0.2", "fe80::1"]);
        assert_eq!(addrs("b.example"), ["10.0.0.1"]);
        assert_eq!(addrs("tab.example"), ["10.0.0.5"]);
        assert_eq!(addrs("ok.example"), ["10.0.0.4"]);
        assert!(addrs("x.example").is_empty() && addrs("example").is_empty());
        assert_eq!(h.skipped, 3, "no address, no name, a bad name");
        assert_eq!(h.len(), 6);
        let names = |a: &str| {
            h.names(a.parse().unwrap())
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("10.0.0.1"), [name("a.example"), name("b.example")]);
        assert_eq!(names("10.0.0.2"), [name("a.example")]);
    }

    #[test]
    fn reverse_names() {
        let r = |s: &str| reverse(&name(s)).map(|a| a.to_string());
        assert_eq!(r("4.3.2.10.in-addr.ARPA").as_deref(), Some("10.2.3.4"));
        let v6 = "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.e.f.ip6.arpa";
        assert_eq!(r(v6).as_deref(), Some("fe80::1"));
        for not in [
            "3.2.10.in-addr.arpa",
            "x.3.2.1.in-addr.arpa",
            "256.3.2.1.in-addr.arpa",
        ] {
            assert_eq!(r(not), None, "{not}");
        }
        assert_eq!(r(&v6.replacen("1.", "10.", 1)), None);
        assert_eq!(r("a.example"), None);
    }

    /// The cap holds whatever the file holds, and a 50,000-line file parses whole.
    #[test]
    fn bounded() {
        let mut text = String::new();
        for i in 0..50_000u32 {
            let [_, a, b, c] = i.to_be_bytes();
            text.push_str(&format!("10.{a}.{b}.{c} host-{i}.example.com\n"));
        }
        let h = Hosts::parse(text.as_bytes());
        assert_eq!((h.len(), h.skipped), (50_000, 0));
        assert_eq!(h.addrs(&name("HOST-49999.example.com")).count(), 1);
        let many = "1.1.1.1 a b c d e f g h i j\n".repeat(MAX_ENTRIES / 10 + 5);
        let h = Hosts::parse(many.as_bytes());
        assert_eq!(h.len(), 10, "duplicates are one record each");
        let distinct: String = (0..MAX_ENTRIES + 3)
            .map(|i| format!("1.1.1.1 n{i}\n"))
            .collect();
        let h = Hosts::parse(distinct.as_bytes());
        assert_eq!((h.len(), h.skipped), (MAX_ENTRIES, 3));
    }
}
