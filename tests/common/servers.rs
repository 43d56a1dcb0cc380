//! Real DNS servers (dnsmasq, unbound, knot) run as upstreams at a [`Place`]: on loopback
//! addresses of the host (high ports, no root needed), or inside a namespace on port 53.
//! Each is killed and reaped on drop; `start` returns once it answers.

use super::client::{dns_answers, udp_exchange};
use super::netns::Place;
use super::{LogCollector, TempDir, kill_and_reap, poll_until, spawn_logged};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::process::Child;
use std::time::{Duration, Instant};

/// How long a server gets to start answering.
pub const SERVER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// Polls `addr` from `at` until it answers a query for `probe_name`,
/// panicking with the server's output if it exits or stays silent.
fn wait_until_answering(
    what: &str,
    at: &Place,
    addr: SocketAddr,
    probe_name: &str,
    child: &mut Child,
    log: &LogCollector,
) {
    let deadline = Instant::now() + SERVER_START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited during start-up ({status}) in {}:\n{}",
                at.describe(),
                log.text()
            );
        }
        if dns_answers(at, addr, probe_name, Duration::from_millis(200)) {
            return;
        }
        if Instant::now() >= deadline {
            kill_and_reap(child);
            panic!(
                "{what} did not answer on {addr} in {} within {SERVER_START_TIMEOUT:?}:\n{}",
                at.describe(),
                log.text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The one port every address of a server's `listen` list shares (dnsmasq and unbound take one
/// port for all their addresses here).
fn common_port(what: &str, listen: &[SocketAddr]) -> u16 {
    assert!(!listen.is_empty(), "{what} needs a listen address");
    let port = listen[0].port();
    assert!(
        port != 0 && listen.iter().all(|a| a.port() == port),
        "{what} listens on one known port on every address: {listen:?}"
    );
    port
}

/// A dnsmasq serving only local data (no upstream, no /etc/hosts, no
/// resolv.conf): names it does not know get REFUSED.
pub struct Dnsmasq {
    child: Child,
    log: LogCollector,
    pub listen: Vec<SocketAddr>,
}

/// TTL dnsmasq gives its local records. dnsmasq's default is 0, which would
/// make them uncacheable for the forwarder.
pub const DNSMASQ_LOCAL_TTL: u32 = 60;

impl Dnsmasq {
    /// `records` become `--host-record=name,ip` (A or AAAA by address family).
    pub fn start(at: impl Into<Place>, listen: SocketAddr, records: &[(&str, IpAddr)]) -> Dnsmasq {
        Dnsmasq::start_with(at, &[listen], records, &[], &[])
    }

    /// Full form: several listen addresses (v4 and/or v6, one port), `wildcards`
    /// become `--address=/domain/ip` (the domain and every name below it),
    /// `extra_args` are appended verbatim (later flags override earlier, e.g.
    /// `--local-ttl=0`).
    pub fn start_with(
        at: impl Into<Place>,
        listen: &[SocketAddr],
        records: &[(&str, IpAddr)],
        wildcards: &[(&str, IpAddr)],
        extra_args: &[&str],
    ) -> Dnsmasq {
        let at = at.into();
        let port = common_port("dnsmasq", listen);
        let mut args: Vec<String> = [
            "--keep-in-foreground", // foreground without debug mode (-d) chatter
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
            "--pid-file=", // empty: no pid file
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--port={port}"));
        if super::effective_uid() == Some(0) {
            // As root dnsmasq would switch to `nobody`, and the default group `dip` may not exist.
            args.extend(["--user=root".to_string(), "--group=root".to_string()]);
        }
        args.push(format!("--local-ttl={DNSMASQ_LOCAL_TTL}"));
        args.extend(
            listen
                .iter()
                .map(|a| format!("--listen-address={}", a.ip())),
        );
        args.extend(
            records
                .iter()
                .map(|(name, ip)| format!("--host-record={name},{ip}")),
        );
        args.extend(
            wildcards
                .iter()
                .map(|(domain, ip)| format!("--address=/{domain}/{ip}")),
        );
        args.extend(extra_args.iter().map(|s| s.to_string()));

        let mut cmd = at.command("dnsmasq", &args);
        // Own process group: dnsmasq forks a child per TCP connection, and
        // Drop kills the whole group.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let (mut child, log) = spawn_logged(cmd, "dnsmasq");
        for addr in listen {
            wait_until_answering(
                "dnsmasq",
                &at,
                *addr,
                "harness-probe.invalid.",
                &mut child,
                &log,
            );
        }
        Dnsmasq {
            child,
            log,
            listen: listen.to_vec(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What dnsmasq printed (it logs to syslog, so usually only errors).
    pub fn logs(&self) -> String {
        self.log.text()
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        // Negative pid: the process group, TCP helpers included.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-(self.child.id() as i32)),
            nix::sys::signal::Signal::SIGKILL,
        );
        kill_and_reap(&mut self.child);
    }
}

/// An unbound serving static local zones from a generated config (no
/// recursion: the module chain is the iterator alone and the upstream
/// namespace has no route out).
pub struct Unbound {
    child: Child,
    log: LogCollector,
    dir: TempDir,
    pub listen: Vec<SocketAddr>,
}

impl Unbound {
    /// One static zone `example.`; `local_data` are RR lines in zone-file
    /// syntax, e.g. `"a.example. 60 IN A 10.0.0.1"` (see [`unbound_big_txt`]).
    /// Several lines with the same name and type form one RRset.
    pub fn start(at: impl Into<Place>, listen: SocketAddr, local_data: &[&str]) -> Unbound {
        Unbound::start_with(at, &[listen], &["example."], local_data, "")
    }

    /// Full form: listen addresses (one port), the static zones, the local data, and
    /// extra lines for the `server:` clause (indented by you or not).
    pub fn start_with(
        at: impl Into<Place>,
        listen: &[SocketAddr],
        static_zones: &[&str],
        local_data: &[&str],
        extra_server_conf: &str,
    ) -> Unbound {
        let at = at.into();
        let port = common_port("unbound", listen);
        let dir = TempDir::new("unbound");
        let mut conf = String::from("server:\n");
        for addr in listen {
            conf.push_str(&format!("  interface: {}\n", addr.ip()));
        }
        conf.push_str(&format!("  port: {port}\n"));
        conf.push_str(&format!(
            concat!(
                "  do-daemonize: no\n",
                "  username: \"\"\n",
                "  chroot: \"\"\n",
                "  directory: \"{dir}\"\n",
                "  pidfile: \"\"\n",
                "  use-syslog: no\n",
                "  logfile: \"\"\n",
                "  verbosity: 0\n",
                "  num-threads: 1\n",
                // No validator: it would want a trust anchor.
                "  module-config: \"iterator\"\n",
                "  access-control: 0.0.0.0/0 allow\n",
                "  access-control: ::/0 allow\n",
                // A forward-addr on loopback (the loopback tier's upstreams) is allowed.
                "  do-not-query-localhost: no\n",
            ),
            dir = dir.path().display()
        ));
        for zone in static_zones {
            conf.push_str(&format!("  local-zone: \"{zone}\" static\n"));
        }
        for rr in local_data {
            // Single quotes, because TXT data carries double quotes.
            assert!(!rr.contains('\''), "local-data must not contain ': {rr}");
            conf.push_str(&format!("  local-data: '{rr}'\n"));
        }
        for line in extra_server_conf.lines() {
            conf.push_str(&format!("  {}\n", line.trim()));
        }
        conf.push_str("remote-control:\n  control-enable: no\n");
        let conf_path = dir.path().join("unbound.conf");
        std::fs::write(&conf_path, &conf)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", conf_path.display()));

        let cmd = at.command(
            "unbound",
            [OsStr::new("-d"), OsStr::new("-c"), conf_path.as_os_str()],
        );
        let (mut child, log) = spawn_logged(cmd, "unbound");
        for addr in listen {
            // `invalid.` is one of unbound's built-in local zones: answered
            // at once, whatever the configured zones.
            wait_until_answering(
                &format!("unbound (config:\n{conf})"),
                &at,
                *addr,
                "harness-probe.invalid.",
                &mut child,
                &log,
            );
        }
        Unbound {
            child,
            log,
            dir,
            listen: listen.to_vec(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> String {
        self.log.text()
    }

    /// The generated configuration file.
    pub fn config_path(&self) -> std::path::PathBuf {
        self.dir.path().join("unbound.conf")
    }
}

impl Drop for Unbound {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// A local-data line for unbound: one TXT record at `name` (TTL 60) made of
/// `strings` character strings of `len` bytes each (2..=255); e.g. 12 x 250
/// gives a ~3 KB answer: TC over UDP at dig's default EDNS size (1232), whole
/// over TCP. String i is its two-digit index followed by one repeated letter.
pub fn unbound_big_txt(name: &str, strings: usize, len: usize) -> String {
    assert!(
        (2..=255).contains(&len),
        "a TXT string is 2..=255 bytes here"
    );
    let mut rr = format!("{name} 60 IN TXT");
    for i in 0..strings {
        rr.push(' ');
        rr.push_str(&txt_string(i, len));
    }
    rr
}

/// `"NNfff...f"`: a quoted TXT string of `len` bytes for index `i`.
fn txt_string(i: usize, len: usize) -> String {
    let fill = char::from(b'a' + (i % 26) as u8);
    format!("\"{:02}{}\"", i % 100, fill.to_string().repeat(len - 2))
}

/// local-data lines for a TXT RRset (several records, unlike
/// [`unbound_big_txt`]) of `records` records (TTL 60), each one
/// string of `len` bytes (2..=255): record i's string is its two-digit index
/// followed by one repeated letter, so a test can spot loss or mixing.
pub fn unbound_txt_rrset(name: &str, records: usize, len: usize) -> Vec<String> {
    assert!(
        (2..=255).contains(&len),
        "a TXT string is 2..=255 bytes here"
    );
    (0..records)
        .map(|i| format!("{name} 60 IN TXT {}", txt_string(i, len)))
        .collect()
}

/// knotd, authoritative for one zone, signing it itself (ECDSA P-256, NSEC).
pub struct Knot {
    child: Child,
    log: LogCollector,
    _dir: TempDir,
}

impl Knot {
    /// Serves `zone` (e.g. `"transp.test."`) from the zone file text `zone_text` on `listen`;
    /// returns once the zone's SOA is answered signed.
    pub fn start(at: impl Into<Place>, listen: SocketAddr, zone: &str, zone_text: &str) -> Knot {
        let at = at.into();
        let dir = TempDir::new("knot");
        let d = dir.path().display();
        std::fs::write(dir.path().join(format!("{zone}zone")), zone_text).expect("write zone");
        let conf = format!(
            concat!(
                "server:\n  listen: {ip}@{port}\n  rundir: {d}\n",
                "database:\n  storage: {d}\n",
                "control:\n  listen: {d}/knot.sock\n",
                "log:\n  - target: stderr\n    any: warning\n",
                "policy:\n  - id: fast\n    algorithm: ecdsap256sha256\n",
                "template:\n  - id: default\n    storage: {d}\n    file: \"%s.zone\"\n",
                "zone:\n  - domain: {zone}\n    dnssec-signing: on\n    dnssec-policy: fast\n",
            ),
            ip = listen.ip(),
            port = listen.port(),
            d = d,
            zone = zone,
        );
        let conf_path = dir.path().join("knot.conf");
        std::fs::write(&conf_path, conf).expect("write knot.conf");
        let cmd = at.command("knotd", [OsStr::new("-c"), conf_path.as_os_str()]);
        let (mut child, log) = spawn_logged(cmd, "knotd");
        // Ready once the zone is served signed.
        let mut probe = Message::new();
        probe
            .set_id(1)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .add_query(Query::query(
                Name::from_ascii(zone).expect("a valid zone name"),
                RecordType::SOA,
            ));
        let mut edns = Edns::new();
        edns.set_max_payload(1232).set_dnssec_ok(true);
        probe.set_edns(edns);
        let probe = probe.to_vec().expect("encode the probe");
        let signed = poll_until(Duration::from_secs(15), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("knotd exited ({status}):\n{}", log.text());
            }
            let r = udp_exchange(&at, listen, &probe, Duration::from_millis(300))?;
            let m = Message::from_vec(&r).ok()?;
            m.answers()
                .iter()
                .any(|r| r.record_type() == RecordType::RRSIG)
                .then_some(())
        });
        if signed.is_none() {
            kill_and_reap(&mut child);
            panic!("knotd did not serve {zone} signed in 15 s:\n{}", log.text());
        }
        Knot {
            child,
            log,
            _dir: dir,
        }
    }

    pub fn logs(&self) -> String {
        self.log.text()
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
