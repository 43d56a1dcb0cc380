//! kube-proxy in ipvs mode: kube-dns is a virtual service on its ClusterIP port 53 and its pods are
//! the real servers. Read from `/proc/net/ip_vs` (no tool needed), else from `ipvsadm -Ln`.
//!
//! Both list each virtual service on a line of its own (`UDP  0A00000A:0035 rr` in the kernel's
//! hex, `UDP  10.0.0.10:53 rr` from ipvsadm) followed by its real servers
//! (`  -> 0AF40005:0035      Masq    1      0          0`: address, forwarding, weight, active and
//! inactive connections). The kernel prints IPv6 as `[fd00:0010:...:000a]:0035` (`%pI6`, every
//! group spelled out), ipvsadm as `[fd00:10::a]:53`. Firewall-mark services (`FWM`) are skipped.

use super::KubeDns;
use super::tool::{self, TOOL_TIMEOUT};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

/// The kernel's table of virtual services, present while the ip_vs module is loaded. It shows
/// the reader's network namespace, which for us is the node's.
const PROC_IP_VS: &str = "/proc/net/ip_vs";

/// Reads kube-dns from the kernel's ipvs table. `cluster_ip` picks the virtual service; see
/// [`parse_proc`] for what happens without one.
pub fn discover(cluster_ip: Option<IpAddr>) -> Result<KubeDns, String> {
    match std::fs::read_to_string(PROC_IP_VS) {
        Ok(text) => return Ok(parse_proc(&text, cluster_ip)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {PROC_IP_VS}: {e}")),
    }
    // ipvsadm runs `modprobe ip_vs` when the module is absent: a discovery probe must not load
    // kernel modules on the node, so ask ipvsadm only when the module is already there.
    if !Path::new("/sys/module/ip_vs").exists() {
        let why = "kube-proxy is not in ipvs mode";
        return Err(format!(
            "ip_vs is not loaded (no {PROC_IP_VS}, no /sys/module/ip_vs): {why}"
        ));
    }
    tool::run("ipvsadm", &["-Ln"], TOOL_TIMEOUT)
        .map(|text| parse_ipvsadm(&text, cluster_ip))
        .map_err(|e| format!("ip_vs is loaded but {PROC_IP_VS} is absent, and {e}"))
}

/// Parses `/proc/net/ip_vs`. The kube-dns virtual services are those on `cluster_ip` port 53.
/// Without a cluster IP, the one UDP virtual service on port 53 is taken as kube-dns if there is
/// exactly one; with none or several (a second DNS service, a dual-stack kube-dns) the answer is
/// empty rather than a guess. Real servers of weight 0 (pods kube-proxy is draining) are left out.
pub fn parse_proc(text: &str, cluster_ip: Option<IpAddr>) -> KubeDns {
    choose(&virtual_services(text, proc_addr), cluster_ip)
}

/// Parses `ipvsadm -Ln`; chooses like [`parse_proc`].
pub fn parse_ipvsadm(text: &str, cluster_ip: Option<IpAddr>) -> KubeDns {
    let services = virtual_services(text, |word| word.parse().ok());
    choose(&services, cluster_ip)
}

/// A TCP or UDP virtual service and its real servers of non-zero weight.
struct VirtualService {
    udp: bool,
    addr: SocketAddr,
    real: Vec<SocketAddr>,
}

fn virtual_services(text: &str, addr: fn(&str) -> Option<SocketAddr>) -> Vec<VirtualService> {
    let mut services: Vec<VirtualService> = Vec::new();
    // Whether the last service line was one we keep: real servers below any other line (the
    // headers, an FWM or SCTP service) belong to nothing we report.
    let mut open = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["->", real, _forward, weight, ..] => {
                // Weight 0 is how kube-proxy drains a terminating pod: no new queries to it.
                if open && weight.parse::<i64>().is_ok_and(|w| w > 0) {
                    if let (Some(service), Some(real)) = (services.last_mut(), addr(real)) {
                        service.real.push(real);
                    }
                }
            }
            [proto @ ("TCP" | "UDP"), local, ..] => {
                let service = addr(local).map(|addr| VirtualService {
                    udp: *proto == "UDP",
                    addr,
                    real: Vec::new(),
                });
                open = service.is_some();
                services.extend(service);
            }
            _ => open = false,
        }
    }
    services
}

fn choose(services: &[VirtualService], cluster_ip: Option<IpAddr>) -> KubeDns {
    // One UDP port-53 virtual service, however many times the text lists it.
    let dns = services.iter().filter(|s| s.udp && s.addr.port() == 53);
    let ip = cluster_ip.or_else(|| match super::unique(dns.map(|s| s.addr.ip()))[..] {
        [only] => Some(only),
        _ => None,
    });
    let Some(ip) = ip else {
        return KubeDns::default();
    };
    let kube_dns = SocketAddr::new(ip, 53);
    // The same virtual service may appear twice in the text; each real server is listed once.
    let real = |udp: bool| {
        let at = services
            .iter()
            .filter(|s| s.udp == udp && s.addr == kube_dns);
        super::unique(at.flat_map(|s| s.real.iter().copied()))
    };
    let listed = services.iter().any(|s| s.addr == kube_dns);
    KubeDns {
        udp: real(true),
        tcp: real(false),
        cluster_ip: listed.then_some(ip),
    }
}

/// `0A00000A:0035` or `[fd00:0010:0000:0000:0000:0000:0000:000a]:0035`: hex, port included.
fn proc_addr(word: &str) -> Option<SocketAddr> {
    let (ip, port) = word.rsplit_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.strip_prefix('[').and_then(|ip| ip.strip_suffix(']')) {
        Some(v6) => IpAddr::V6(v6.parse().ok()?),
        None if ip.len() == 8 => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?)),
        None => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    /// Each case, read from both the kernel's and ipvsadm's text, must give the same answer.
    fn both(name: &str, proc: &str, ipvsadm: &str, cluster_ip: Option<IpAddr>, want: &KubeDns) {
        assert_eq!(&parse_proc(proc, cluster_ip), want, "proc-{name}.txt");
        assert_eq!(
            &parse_ipvsadm(ipvsadm, cluster_ip),
            want,
            "ipvsadm-{name}.txt"
        );
    }

    #[test]
    fn one_endpoint_with_and_without_cluster_ip() {
        let proc = include_str!("../../tests/fixtures/ipvs/proc-one-endpoint.txt");
        let adm = include_str!("../../tests/fixtures/ipvs/ipvsadm-one-endpoint.txt");
        let want = KubeDns {
            udp: addrs(&["10.244.0.5:53"]),
            tcp: addrs(&["10.244.0.5:53"]),
            cluster_ip: ip("10.0.0.10"),
        };
        both("one-endpoint", proc, adm, None, &want);
        both("one-endpoint", proc, adm, ip("10.0.0.10"), &want);
        // A wrong cluster IP finds nothing, rather than falling back to a guess.
        both(
            "one-endpoint",
            proc,
            adm,
            ip("10.0.0.11"),
            &KubeDns::default(),
        );
    }

    #[test]
    fn terminating_real_servers_are_skipped() {
        let proc = include_str!("../../tests/fixtures/ipvs/proc-three-endpoints-terminating.txt");
        let adm = include_str!("../../tests/fixtures/ipvs/ipvsadm-three-endpoints-terminating.txt");
        let three = addrs(&["10.244.0.5:53", "10.244.1.7:53", "10.244.2.11:53"]);
        let want = KubeDns {
            udp: three.clone(),
            tcp: three,
            cluster_ip: ip("10.0.0.10"),
        };
        both("three-endpoints-terminating", proc, adm, None, &want);
    }

    #[test]
    fn ipv6() {
        let proc = include_str!("../../tests/fixtures/ipvs/proc-ipv6.txt");
        let adm = include_str!("../../tests/fixtures/ipvs/ipvsadm-ipv6.txt");
        let two = addrs(&["[fd00:10:244::5]:53", "[fd00:10:244:1::7]:53"]);
        let want = KubeDns {
            udp: two.clone(),
            tcp: two,
            cluster_ip: ip("fd00:10:96::a"),
        };
        both("ipv6", proc, adm, None, &want);
        both("ipv6", proc, adm, ip("fd00:10:96::a"), &want);
    }

    #[test]
    fn two_dns_services_need_the_cluster_ip() {
        let proc = include_str!("../../tests/fixtures/ipvs/proc-two-dns-services.txt");
        let adm = include_str!("../../tests/fixtures/ipvs/ipvsadm-two-dns-services.txt");
        both("two-dns-services", proc, adm, None, &KubeDns::default());
        // The FWM service's real server right after kube-dns's UDP service must not join it.
        let two = addrs(&["10.244.0.5:53", "10.244.1.7:53"]);
        let want = KubeDns {
            udp: two.clone(),
            tcp: two,
            cluster_ip: ip("10.0.0.10"),
        };
        both("two-dns-services", proc, adm, ip("10.0.0.10"), &want);
    }

    #[test]
    fn no_kube_dns() {
        let proc = include_str!("../../tests/fixtures/ipvs/proc-no-kube-dns.txt");
        let adm = include_str!("../../tests/fixtures/ipvs/ipvsadm-no-kube-dns.txt");
        both("no-kube-dns", proc, adm, None, &KubeDns::default());
        both(
            "no-kube-dns",
            proc,
            adm,
            ip("10.0.0.10"),
            &KubeDns::default(),
        );
    }

    #[test]
    fn garbage_is_empty_never_a_panic() {
        let garbage = [
            "",
            "\n\n",
            "->",
            "  -> 0AF40005:0035",
            "UDP",
            "UDP  0A00000A",
            "UDP  0A00000A:zz rr\n  -> 0AF40005:0035 Masq 1 0 0",
            "UDP  [::1:0035 rr\n  -> [zz]:0035 Masq 1 0 0",
            "UDP  0A00000A:0035 rr\n  -> 0AF40005:0035 Masq x 0 0\n  -> 0AF40005:0035 Masq -3 0 0",
            "UDP  10.0.0.10:53\n  -> 10.244.0.5:53 Masq 99999999999999999999 0 0",
            "\u{0}\u{ffff} UDP -> -> ->",
        ];
        for text in garbage {
            let proc = parse_proc(text, None);
            let adm = parse_ipvsadm(text, None);
            assert!(
                proc.udp.is_empty() && proc.tcp.is_empty(),
                "{text:?}: {proc:?}"
            );
            assert!(
                adm.udp.is_empty() && adm.tcp.is_empty(),
                "{text:?}: {adm:?}"
            );
        }
    }

    #[test]
    fn proc_addresses() {
        assert_eq!(
            proc_addr("0A00000A:0035"),
            Some("10.0.0.10:53".parse().unwrap())
        );
        assert_eq!(
            proc_addr("[fd00:0010:0096:0000:0000:0000:0000:000a]:0035"),
            Some("[fd00:10:96::a]:53".parse().unwrap())
        );
        assert_eq!(proc_addr("0A00000A:10035"), None);
        assert_eq!(proc_addr("A00000A:0035"), None);
        assert_eq!(proc_addr("10.0.0.10:53"), None);
    }
}
