//! kube-proxy in iptables mode: the kube-dns backends are the DNAT targets behind the service's
//! ClusterIP rule. Reads only the chains on that path (`iptables -S CHAIN`), never the whole table:
//! a big cluster's nat table holds tens of thousands of rules.
//!
//! ```text
//! -A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
//! -A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.5:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-IT2ZTR26TO4XFPTO
//! -A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53
//! ```

use std::net::{IpAddr, SocketAddr};

use super::{KubeDns, ServiceName, tool};

/// Seconds iptables may wait for the xtables lock held by kube-proxy's own sync.
const LOCK_WAIT: &str = "2";

/// The ClusterIP rule of one service port in KUBE-SERVICES.
#[derive(Debug, PartialEq, Eq)]
pub struct ServiceRule {
    pub cluster_ip: Option<IpAddr>,
    /// The `KUBE-SVC-*` chain that spreads over the endpoints.
    pub chain: String,
}

/// Splits an `iptables -S` line into words; double-quoted words (comments) keep their spaces.
fn words(line: &str) -> Vec<&str> {
    // Every other piece between quotes is quoted: one word, spaces and all.
    line.split('"')
        .enumerate()
        .flat_map(|(i, piece)| match i % 2 {
            1 => vec![piece],
            _ => piece.split_whitespace().collect(),
        })
        .collect()
}

fn option<'a>(words: &[&'a str], name: &str) -> Option<&'a str> {
    let at = words.iter().position(|w| *w == name)?;
    words.get(at + 1).copied()
}

/// Finds the ClusterIP rule of `service`'s port `port_name` (`dns` or `dns-tcp`) in the
/// `iptables -S KUBE-SERVICES` output.
pub fn parse_services(text: &str, service: &ServiceName, port_name: &str) -> Option<ServiceRule> {
    let comment = format!("{service}:{port_name} cluster IP");
    // A cheap substring test first: only the one matching line is split into words.
    text.lines()
        .filter(|l| l.contains(&comment))
        .find_map(|line| {
            let w = words(line);
            if option(&w, "--comment") != Some(comment.as_str()) {
                return None;
            }
            let chain = option(&w, "-j")
                .filter(|c| c.starts_with("KUBE-SVC-"))?
                .to_string();
            let cluster_ip = option(&w, "-d").and_then(|d| d.split('/').next()?.parse().ok());
            Some(ServiceRule { cluster_ip, chain })
        })
}

/// The `KUBE-SEP-*` chains a `KUBE-SVC-*` chain jumps to, in rule order.
pub fn parse_service_chain(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("-A "))
        .filter_map(|l| {
            option(&words(l), "-j")
                .filter(|t| t.starts_with("KUBE-SEP-"))
                .map(str::to_string)
        })
        .collect()
}

/// The DNAT destination of a `KUBE-SEP-*` chain.
pub fn parse_endpoint_chain(text: &str) -> Option<SocketAddr> {
    text.lines()
        .filter(|l| l.starts_with("-A ") && l.contains("DNAT"))
        .find_map(|l| option(&words(l), "--to-destination")?.parse().ok())
}

/// Backends of kube-dns in this family's nat table (`ip6tables` for IPv6).
pub fn discover(service: &ServiceName, ipv6: bool) -> Result<KubeDns, String> {
    let program = if ipv6 { "ip6tables" } else { "iptables" };
    let list = |chain: &str| {
        tool::run(
            program,
            &["-w", LOCK_WAIT, "-t", "nat", "-S", chain],
            tool::TOOL_TIMEOUT,
        )
    };
    let services = list("KUBE-SERVICES")?;
    let [udp, tcp] =
        ["dns", "dns-tcp"].map(|port_name| parse_services(&services, service, port_name));
    // Both ports' chains, then every endpoint chain, read side by side.
    let endpoints = |rule: &Option<ServiceRule>| -> Result<Vec<SocketAddr>, String> {
        let Some(rule) = rule else {
            return Ok(Vec::new());
        };
        let chains = parse_service_chain(&list(&rule.chain)?);
        let texts = tool::each_at_once(&chains, |chain| list(chain));
        let texts = texts.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(super::unique(
            texts.iter().filter_map(|t| parse_endpoint_chain(t)),
        ))
    };
    let cluster_ip = udp.iter().chain(&tcp).find_map(|r| r.cluster_ip);
    let (udp, tcp) = tool::side_by_side(|| endpoints(&udp), || endpoints(&tcp));
    Ok(KubeDns {
        udp: udp?,
        tcp: tcp?,
        cluster_ip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICES: &str = r#"-N KUBE-SERVICES
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SERVICES -d 10.0.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4
-A KUBE-SERVICES -d 10.0.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:metrics cluster IP" -m tcp --dport 9153 -j KUBE-SVC-JD5MR3NA4I4DYORP
-A KUBE-SERVICES -d 10.0.0.99/32 -p udp -m comment --comment "other/kube-dns-lookalike:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
"#;

    const SVC: &str = r#"-N KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.5:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.1.7:53" -j KUBE-SEP-ZXMNUKOKXUTL2MK2
"#;

    const SEP: &str = r#"-N KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.5/32 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53
"#;

    #[test]
    fn finds_the_service_rules() {
        let svc = ServiceName::default();
        let udp = parse_services(SERVICES, &svc, "dns").unwrap();
        assert_eq!(udp.chain, "KUBE-SVC-TCOU7JCQXEZGVUNU");
        assert_eq!(udp.cluster_ip, Some("10.0.0.10".parse().unwrap()));
        assert_eq!(
            parse_services(SERVICES, &svc, "dns-tcp").unwrap().chain,
            "KUBE-SVC-ERIFXISQEP7F7OF4"
        );
        let other = ServiceName {
            namespace: "other".into(),
            name: "kube-dns".into(),
        };
        assert_eq!(parse_services(SERVICES, &other, "dns"), None);
        assert_eq!(parse_services("", &svc, "dns"), None);
    }

    #[test]
    fn follows_the_spreading_rules_in_order() {
        assert_eq!(
            parse_service_chain(SVC),
            ["KUBE-SEP-IT2ZTR26TO4XFPTO", "KUBE-SEP-ZXMNUKOKXUTL2MK2"]
        );
        assert!(parse_service_chain("-N KUBE-SVC-X\n").is_empty());
    }

    #[test]
    fn reads_the_dnat_target() {
        assert_eq!(
            parse_endpoint_chain(SEP),
            Some("10.244.0.5:53".parse().unwrap())
        );
        let v6 = "-A KUBE-SEP-X -p udp -m comment --comment \"kube-system/kube-dns:dns\" -m udp -j DNAT --to-destination [fd00:10:244::5]:53";
        assert_eq!(
            parse_endpoint_chain(v6),
            Some("[fd00:10:244::5]:53".parse().unwrap())
        );
        assert_eq!(
            parse_endpoint_chain("-A KUBE-SEP-X -j DNAT --to-destination nonsense"),
            None
        );
    }

    #[test]
    fn splits_quoted_words() {
        assert_eq!(
            words(r#"-A X --comment "a b:c d" -j Y"#),
            ["-A", "X", "--comment", "a b:c d", "-j", "Y"]
        );
        assert_eq!(words(r#"--comment """#), ["--comment", ""]);
        assert_eq!(words("  "), Vec::<String>::new());
    }
}
