//! kube-dns backends from the Cilium agent's own API (`GET /v1/service` on its unix socket).
//!
//! Shape (Cilium `api/v1/openapi.yaml`, `Service`/`ServiceSpec`/`FrontendAddress`/`BackendAddress`):
//! a JSON array of `{"spec": {"frontend-address": {ip, port, protocol?, scope},
//! "backend-addresses": [{ip, port, state?, weight?, ...}], "flags": {type, namespace, name, ...}},
//! "status": {...}}`, one entry per frontend. Agents before 1.17 leave `protocol` out (they did not
//! tell UDP from TCP, so one entry serves both); agents before 1.10 leave `state` out.

use super::{KubeDns, ServiceName};
use serde_json::Value;
use serde_json::value::RawValue;
use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where the Cilium agent listens on every node it runs on.
pub const DEFAULT_SOCKET: &str = "/var/run/cilium/cilium.sock";

/// Longest one whole exchange with the agent may take: a wedged agent must not wedge discovery.
const AGENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Largest answer read: the list grows with the cluster's services (a few hundred bytes each),
/// and a broken peer must not make us allocate without bound.
const MAX_RESPONSE: usize = 64 << 20;

/// HTTP/1.0 so the agent answers with a plain body and closes: the end of the stream is the end
/// of the answer.
const REQUEST: &[u8] =
    b"GET /v1/service HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n\r\n";

/// Asks the agent at `socket` for its service list and picks out `service`.
pub fn discover(socket: &Path, service: &ServiceName) -> Result<KubeDns, String> {
    let response = fetch(socket)?;
    let body = parse_http_response(&response)?;
    let json = std::str::from_utf8(&body).map_err(|_| {
        format!(
            "the Cilium agent at {} sent a service list that is not UTF-8",
            socket.display()
        )
    })?;
    parse(json, service)
}

/// Picks the port-53 backends of `service` out of a `GET /v1/service` body. Only the list
/// itself being unreadable is an error; entries of an unexpected shape are skipped.
pub fn parse(json: &str, service: &ServiceName) -> Result<KubeDns, String> {
    // The list is kept as borrowed slices of the text and each entry made a value on its own:
    // a full tree of a big cluster's list takes about 17 times the text (60 MB for 10,000
    // services), one entry at a time next to nothing.
    let entries: Vec<&RawValue> = serde_json::from_str(json).map_err(|e| {
        format!("the Cilium agent's service list is not a JSON array of objects: {e}")
    })?;
    let mut found = KubeDns::default();
    // `value["key"]` is Null for a missing key or a non-object, so no shape can panic here.
    for entry in entries {
        let Ok(entry) = serde_json::from_str::<Value>(entry.get()) else {
            continue;
        };
        let spec = &entry["spec"];
        let (flags, frontend) = (&spec["flags"], &spec["frontend-address"]);
        // Cluster mesh: the same name in another cluster resolves that cluster's names.
        let other_cluster = flags["cluster"].as_str().is_some_and(|c| !c.is_empty());
        if flags["namespace"] != service.namespace
            || flags["name"] != service.name
            || other_cluster
            || frontend["port"].as_u64() != Some(53)
        {
            continue;
        }
        let protocol = frontend["protocol"]
            .as_str()
            .unwrap_or("")
            .to_ascii_uppercase();
        let (udp, tcp) = match protocol.as_str() {
            "UDP" => (true, false),
            "TCP" => (false, true),
            // Older agents: one protocol-less entry stands for both ports.
            "" | "ANY" | "NONE" => (true, true),
            _ => continue,
        };
        let cluster_ip = ip(&frontend["ip"]).filter(|_| flags["type"] == "ClusterIP");
        // Dual stack: the IPv4 ClusterIP, whatever order the agent lists them in; of two of one
        // family, the first (`min_by_key` keeps the first of equals).
        let known = found.cluster_ip.into_iter().chain(cluster_ip);
        found.cluster_ip = known.min_by_key(IpAddr::is_ipv6);
        let backends = spec["backend-addresses"].as_array().into_iter().flatten();
        for addr in backends.filter_map(active_backend) {
            if udp && !found.udp.contains(&addr) {
                found.udp.push(addr);
            }
            if tcp && !found.tcp.contains(&addr) {
                found.tcp.push(addr);
            }
        }
    }
    Ok(found)
}

/// A backend Cilium itself sends traffic to: `active` (or no state, from agents that predate
/// it), not weighted to zero.
fn active_backend(backend: &Value) -> Option<SocketAddr> {
    let active = match backend["state"].as_str() {
        None | Some("") => true,
        Some(state) => state.eq_ignore_ascii_case("active"),
    };
    // Cilium reads weight 0 as maintenance.
    if !active || backend["weight"].as_u64() == Some(0) {
        return None;
    }
    let port = u16::try_from(backend["port"].as_u64()?)
        .ok()
        .filter(|&p| p != 0)?;
    Some(SocketAddr::new(ip(&backend["ip"])?, port))
}

/// Cluster-mesh addresses carry the cluster ID after the IP: `10.244.1.5@2`.
fn ip(value: &Value) -> Option<IpAddr> {
    value.as_str()?.split('@').next()?.parse().ok()
}

/// One request, the whole answer, all within `AGENT_TIMEOUT`.
fn fetch(socket: &Path) -> Result<Vec<u8>, String> {
    let shown = socket.display();
    let deadline = Instant::now() + AGENT_TIMEOUT;
    let mut stream = connect(socket)?;
    let io_err = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("the Cilium agent at {shown} did not answer within {AGENT_TIMEOUT:?}")
        }
        _ => format!("cannot talk to the Cilium agent at {shown}: {e}"),
    };
    stream
        .set_write_timeout(Some(AGENT_TIMEOUT))
        .map_err(io_err)?;
    stream.write_all(REQUEST).map_err(io_err)?;
    let mut response = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // The read timeout is per call; re-arming it with what is left bounds the whole answer,
        // even from a peer that trickles a byte at a time.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io_err(ErrorKind::TimedOut.into()));
        }
        stream.set_read_timeout(Some(left)).map_err(io_err)?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(response),
            Ok(n) if response.len() + n > MAX_RESPONSE => {
                return Err(format!(
                    "the Cilium agent at {shown} sent more than {} MiB",
                    MAX_RESPONSE >> 20
                ));
            }
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
}

/// Connects with a time limit: std's blocking connect on a unix socket waits for as long as the
/// agent's accept backlog stays full.
fn connect(socket: &Path) -> Result<UnixStream, String> {
    let shown = socket.display();
    let fail = |e: std::io::Error| match e.kind() {
        ErrorKind::NotFound => format!("no Cilium agent socket at {shown}"),
        ErrorKind::ConnectionRefused => {
            format!("the Cilium agent socket at {shown} refuses connections (agent not running?)")
        }
        _ => format!("cannot connect to the Cilium agent at {shown}: {e}"),
    };
    let addr = SockAddr::unix(socket).map_err(fail)?;
    let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(fail)?;
    sock.connect_timeout(&addr, AGENT_TIMEOUT).map_err(fail)?;
    Ok(sock.into())
}

/// The body of a complete HTTP/1.x response, which must be `200`. Understands `Content-Length`,
/// `Transfer-Encoding: chunked` and bodies delimited by the connection's end.
pub fn parse_http_response(bytes: &[u8]) -> Result<Vec<u8>, String> {
    const TRUNCATED: &str = "the Cilium agent's answer was cut short";
    let head_end = find(bytes, b"\r\n\r\n").ok_or(TRUNCATED)?;
    let head = String::from_utf8_lossy(&bytes[..head_end]);
    let rest = &bytes[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    // `HTTP/1.x CODE REASON`
    let code = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split(' ').nth(1)?.parse::<u16>().ok())
        .ok_or_else(|| format!("the Cilium agent did not answer in HTTP: {status_line:?}"))?;

    let (mut chunked, mut length) = (false, None);
    for (name, value) in lines.filter_map(|line| line.split_once(':')) {
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .split(',')
                .any(|coding| coding.trim().eq_ignore_ascii_case("chunked"));
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        }
    }
    // Chunked wins over Content-Length (RFC 9112 §6.3); neither means "until the end".
    let body = match (chunked, length) {
        (true, _) => decode_chunked(rest),
        (false, Some(n)) => rest
            .get(..n)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| TRUNCATED.to_string()),
        (false, None) => Ok(rest.to_vec()),
    };
    if code != 200 {
        // Cilium puts the reason in the body (a JSON string); show its start.
        let body = body.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let detail: String = text
            .trim()
            .chars()
            .take(200)
            .filter(|c| !c.is_control())
            .collect();
        let colon = if detail.is_empty() { "" } else { ": " };
        return Err(format!(
            "the Cilium agent answered \"{status_line}\"{colon}{detail}"
        ));
    }
    body
}

/// Joins the chunks of a chunked body; trailers after the last chunk are ignored.
fn decode_chunked(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    const BAD: &str = "the Cilium agent's chunked answer is cut short or malformed";
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or(BAD)?;
        let line = std::str::from_utf8(&rest[..line_end]).map_err(|_| BAD)?;
        // A size may carry extensions: `1a;name=value`.
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| BAD)?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let (chunk, after) = rest.split_at_checked(size).ok_or(BAD)?;
        body.extend_from_slice(chunk);
        rest = after.strip_prefix(b"\r\n").ok_or(BAD)?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_18: &str = include_str!("../../tests/fixtures/cilium/v1.18-udp-tcp-dualstack.json");
    const V1_14: &str =
        include_str!("../../tests/fixtures/cilium/v1.14-no-protocol-mixed-states.json");
    const V1_8: &str = include_str!("../../tests/fixtures/cilium/v1.8-backends-without-state.json");
    const NO_KUBE_DNS: &str = include_str!("../../tests/fixtures/cilium/no-kube-dns.json");

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn kube_dns(json: &str) -> KubeDns {
        parse(json, &ServiceName::default()).unwrap()
    }

    #[test]
    fn per_protocol_entries_dual_stack_active_only() {
        let k = kube_dns(V1_18);
        // IPv6 entries come first in the list; 10.244.0.9 is terminating; port 9153 is metrics.
        let both = addrs(&[
            "[fd00:10:244:1::5]:53",
            "[fd00:10:244:2::7]:53",
            "10.244.1.5:53",
            "10.244.2.7:53",
        ]);
        assert_eq!(k.udp, both);
        assert_eq!(k.tcp, both);
        assert_eq!(k.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }

    #[test]
    fn protocol_less_entries_serve_both_and_only_cluster_ip_type_gives_the_cluster_ip() {
        let k = kube_dns(V1_14);
        // Terminating and quarantined backends dropped; the ExternalIPs entry (listed first)
        // shows the same backends but not the ClusterIP; the NodePort entry is not port 53.
        let active = addrs(&["10.244.0.12:53", "10.244.1.9:53"]);
        assert_eq!(k.udp, active);
        assert_eq!(k.tcp, active);
        assert_eq!(k.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }

    #[test]
    fn missing_state_counts_as_active() {
        let k = kube_dns(V1_8);
        assert_eq!(k.udp, addrs(&["10.244.0.3:53", "10.244.1.3:53"]));
        assert_eq!(k.tcp, k.udp);
    }

    #[test]
    fn only_the_exact_service_matches() {
        assert_eq!(kube_dns(NO_KUBE_DNS), KubeDns::default());
        let coredns = ServiceName {
            namespace: "kube-system".into(),
            name: "coredns".into(),
        };
        let k = parse(NO_KUBE_DNS, &coredns).unwrap();
        assert_eq!(k.udp, addrs(&["10.244.1.5:53"]));
        assert_eq!(k.tcp, addrs(&["10.244.1.5:53"]));
        assert_eq!(k.cluster_ip, Some("10.0.0.10".parse().unwrap()));
    }

    #[test]
    fn odd_entries_are_skipped() {
        let json = r#"[
            17, "x", null, {}, {"spec": []}, {"spec": {"flags": "kube-dns"}},
            {"spec": {"flags": {"namespace": "kube-system", "name": "kube-dns", "type": "ClusterIP"},
                      "frontend-address": {"ip": "not-an-ip", "port": 53, "protocol": "UDP"},
                      "backend-addresses": [
                          {"ip": "10.244.1.5@2", "port": 53},
                          {"ip": "10.244.1.6", "port": 53, "weight": 0},
                          {"ip": "10.244.1.7", "port": 0},
                          {"ip": "10.244.1.8", "port": 70000},
                          {"ip": "10.244.1.9", "port": "53"},
                          {"ip": 5, "port": 53},
                          {"ip": "10.244.1.10", "port": 53, "state": "ACTIVE"},
                          {"ip": "10.244.1.5", "port": 53},
                          "10.244.1.11:53"
                      ]}},
            {"spec": {"flags": {"namespace": "kube-system", "name": "kube-dns", "type": "ClusterIP"},
                      "frontend-address": {"ip": "10.0.0.10", "port": 53, "protocol": "SCTP"},
                      "backend-addresses": [{"ip": "10.244.3.1", "port": 53}]}},
            {"spec": {"flags": {"namespace": "kube-system", "name": "kube-dns", "cluster": "east"},
                      "frontend-address": {"ip": "10.1.0.10", "port": 53, "protocol": "udp"},
                      "backend-addresses": [{"ip": "10.245.0.1", "port": 53}]}},
            {"spec": {"flags": {"namespace": "kube-system", "name": "kube-dns"},
                      "frontend-address": {"ip": "10.0.0.10", "port": 53, "protocol": "tcp"},
                      "backend-addresses": {"ip": "10.244.4.1", "port": 53}}}
        ]"#;
        let k = kube_dns(json);
        // Cluster ID stripped and then deduplicated; the SCTP and remote-cluster entries ignored.
        assert_eq!(k.udp, addrs(&["10.244.1.5:53", "10.244.1.10:53"]));
        assert!(k.tcp.is_empty());
        assert_eq!(k.cluster_ip, None);
    }

    #[test]
    fn unreadable_lists_are_errors() {
        assert_eq!(kube_dns("[]"), KubeDns::default());
        assert_eq!(kube_dns(" [ ] \n"), KubeDns::default());
        for bad in [
            "",
            "garbage",
            "[{",
            "{\"spec\": {}}",
            "\"an error\"",
            "null",
            "53",
        ] {
            let err = parse(bad, &ServiceName::default()).unwrap_err();
            assert!(
                err.starts_with("the Cilium agent's service list is not"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn http_plain_content_length_and_close_delimited() {
        let plain = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[1]";
        assert_eq!(parse_http_response(plain).unwrap(), b"[1]");
        let sized = b"HTTP/1.1 200 OK\r\ncOnTeNt-LeNgTh:  3 \r\n\r\n[1]trailing junk";
        assert_eq!(parse_http_response(sized).unwrap(), b"[1]");
        let empty = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(parse_http_response(empty).unwrap(), b"");
    }

    #[test]
    fn http_chunked() {
        let chunked =
            b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: chunked\r\nContent-Length: 99\r\n\r\n\
            4\r\n[{\"a\r\na;ext=1\r\n\": 1}, {} \r\n1\r\n]\r\n0\r\nX-Trailer: y\r\n\r\n";
        assert_eq!(parse_http_response(chunked).unwrap(), b"[{\"a\": 1}, {} ]");
        let gzip_then_chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        assert_eq!(parse_http_response(gzip_then_chunked).unwrap(), b"ok");
    }

    #[test]
    fn http_truncated_or_malformed() {
        let cases: [&[u8]; 10] = [
            b"",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n[1]",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n[1]",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[1]",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1]\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n[1]\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n",
            b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
            b"HTTP/1.1 OK\r\n\r\n",
        ];
        for case in cases {
            assert!(
                parse_http_response(case).is_err(),
                "{:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn http_status_other_than_200_is_an_error_with_the_reason() {
        let err = parse_http_response(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 20\r\n\r\n\"service cache busy\"\n",
        )
        .unwrap_err();
        assert!(
            err.contains("500 Internal Server Error") && err.contains("service cache busy"),
            "{err}"
        );
        let err = parse_http_response(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap_err();
        assert!(err.contains("404"), "{err}");
    }
}
