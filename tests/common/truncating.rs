//! A stand-in kube-dns that truncates like CoreDNS: over UDP an answer larger than the client
//! advertised (512 bytes without EDNS) keeps as many whole records as fit, with TC set (miekg/dns
//! `Truncate`); over TCP it goes whole. `many<N>.<anything>` has N A records (10.77.i.j), every
//! other name NXDOMAIN with an SOA. Untrusted input is dropped, never unwrapped.

use super::netns::Netns;
use hickory_proto::op::{Edns, Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The addresses of `many<n>.*`, in the order they are answered.
pub fn many_addresses(n: usize) -> Vec<Ipv4Addr> {
    (0..n)
        .map(|i| Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1))
        .collect()
}

pub struct TruncatingUpstream {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// UDP replies sent with TC set.
    pub truncated: Arc<AtomicUsize>,
}

impl TruncatingUpstream {
    pub fn start(ns: &Netns, addr: SocketAddr) -> TruncatingUpstream {
        let (udp, tcp) = ns.enter(|| {
            let udp = UdpSocket::bind(addr).expect("bind the stand-in's UDP socket");
            let tcp = TcpListener::bind(addr).expect("bind the stand-in's TCP socket");
            (udp, tcp)
        });
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("set_read_timeout");
        tcp.set_nonblocking(true).expect("set_nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let truncated = Arc::new(AtomicUsize::new(0));
        let udp_thread = {
            let (stop, truncated) = (Arc::clone(&stop), Arc::clone(&truncated));
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::SeqCst) {
                    let Ok((n, from)) = udp.recv_from(&mut buf) else {
                        continue;
                    };
                    if let Some(reply) = answer(&buf[..n], true) {
                        if reply.len() >= 3 && reply[2] & 0x02 != 0 {
                            truncated.fetch_add(1, Ordering::SeqCst);
                        }
                        let _ = udp.send_to(&reply, from);
                    }
                }
            })
        };
        let tcp_thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok((mut conn, _)) = tcp.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    // One connection at a time is plenty for the clients of these tests.
                    loop {
                        let mut len = [0u8; 2];
                        if conn.read_exact(&mut len).is_err() {
                            break;
                        }
                        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if conn.read_exact(&mut query).is_err() {
                            break;
                        }
                        let Some(reply) = answer(&query, false) else {
                            break;
                        };
                        let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                        framed.extend_from_slice(&reply);
                        if conn.write_all(&framed).is_err() {
                            break;
                        }
                    }
                }
            })
        };
        TruncatingUpstream {
            stop,
            threads: vec![udp_thread, tcp_thread],
            truncated,
        }
    }
}

impl Drop for TruncatingUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The reply to `query`, cut like CoreDNS over UDP.
fn answer(query: &[u8], udp: bool) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.message_type() != MessageType::Query {
        return None;
    }
    let question = msg.queries().first()?.clone();
    let mut reply = Message::new();
    reply
        .set_id(msg.id())
        .set_message_type(MessageType::Response)
        .set_recursion_desired(msg.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    reply.add_query(question.clone());
    let limit = match msg.extensions() {
        Some(edns) => {
            let mut opt = Edns::new();
            opt.set_max_payload(1232)
                .set_dnssec_ok(edns.flags().dnssec_ok);
            reply.set_edns(opt);
            usize::from(edns.max_payload().max(512))
        }
        None => 512,
    };
    let label = question.name().iter().next().unwrap_or_default();
    let count = std::str::from_utf8(label).ok().and_then(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("many")?
            .parse::<usize>()
            .ok()
    });
    match count {
        Some(n) if question.query_type() == RecordType::A => {
            for ip in many_addresses(n) {
                reply.add_answer(Record::from_rdata(
                    question.name().clone(),
                    30,
                    RData::A(A(ip)),
                ));
            }
        }
        Some(_) => {
            reply.add_name_server(soa(question.name()));
        }
        None => {
            reply.set_response_code(ResponseCode::NXDomain);
            reply.add_name_server(soa(question.name()));
        }
    }
    let bytes = reply.to_vec().ok()?;
    if !udp || bytes.len() <= limit {
        return Some(bytes);
    }
    // miekg/dns Truncate: whole answer records while they fit, the OPT record kept, TC set.
    let answers = reply.take_answers();
    reply.take_name_servers();
    reply.set_truncated(true);
    for record in answers {
        reply.add_answer(record);
        if reply.to_vec().ok()?.len() > limit {
            reply.answers_mut().pop();
            break;
        }
    }
    reply.to_vec().ok()
}

fn soa(zone: &Name) -> Record {
    let soa = SOA::new(
        Name::from_ascii("ns.test.").expect("literal"),
        Name::from_ascii("host.test.").expect("literal"),
        1,
        3600,
        600,
        86400,
        30,
    );
    Record::from_rdata(zone.base_name(), 30, RData::SOA(soa))
}
