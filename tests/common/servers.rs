//! Real DNS servers (dnsmasq, unbound) run inside a namespace as upstreams.
//! Each is killed and reaped on drop; `start` returns once it answers.

use super::client::dns_answers;
use super::netns::{Netns, dns53};
use super::{LogCollector, TempDir, kill_and_reap, spawn_logged};
use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::process::Child;
use std::time::{Duration, Instant};

/// How long a server gets to start answering.
pub const SERVER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// Polls `addr` from inside `ns` until it answers a query for `probe_name`,
/// panicking with the server's output if it exits or stays silent.
fn wait_until_answering(
    what: &str,
    ns: &Netns,
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
                ns.name,
                log.text()
            );
        }
        if dns_answers(ns, addr, probe_name, Duration::from_millis(200)) {
            return;
        }
        if Instant::now() >= deadline {
            kill_and_reap(child);
            panic!(
                "{what} did not answer on {addr} in {} within {SERVER_START_TIMEOUT:?}:\n{}",
                ns.name,
                log.text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A dnsmasq serving only local data (no upstream, no /etc/hosts, no
/// resolv.conf): names it does not know get REFUSED.
pub struct Dnsmasq {
    child: Child,
    log: LogCollector,
    pub listen: Vec<IpAddr>,
}

/// TTL dnsmasq gives its local records. dnsmasq's default is 0, which would
/// make them uncacheable for the forwarder.
pub const DNSMASQ_LOCAL_TTL: u32 = 60;

impl Dnsmasq {
    /// `records` become `--host-record=name,ip` (A or AAAA by address family).
    pub fn start(ns: &Netns, listen: IpAddr, records: &[(&str, IpAddr)]) -> Dnsmasq {
        Dnsmasq::start_with(ns, &[listen], records, &[], &[])
    }

    /// Full form: several listen addresses (v4 and/or v6), `wildcards`
    /// become `--address=/domain/ip` (the domain and every name below it),
    /// `extra_args` are appended verbatim (later flags override earlier, e.g.
    /// `--local-ttl=0`).
    pub fn start_with(
        ns: &Netns,
        listen: &[IpAddr],
        records: &[(&str, IpAddr)],
        wildcards: &[(&str, IpAddr)],
        extra_args: &[&str],
    ) -> Dnsmasq {
        assert!(!listen.is_empty(), "dnsmasq needs a listen address");
        let mut args: Vec<String> = [
            "--keep-in-foreground", // foreground without debug mode (-d) chatter
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
            "--port=53",
            "--user=root",
            "--group=root", // the default group `dip` may not exist
            "--pid-file=",  // empty: no pid file
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--local-ttl={DNSMASQ_LOCAL_TTL}"));
        args.extend(listen.iter().map(|ip| format!("--listen-address={ip}")));
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

        let mut cmd = ns.exec("dnsmasq", &args);
        // Own process group: dnsmasq forks a child per TCP connection, and
        // Drop kills the whole group.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let (mut child, log) = spawn_logged(cmd, "dnsmasq");
        for ip in listen {
            wait_until_answering(
                "dnsmasq",
                ns,
                dns53(*ip),
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
    pub listen: Vec<IpAddr>,
}

impl Unbound {
    /// One static zone `example.`; `local_data` are RR lines in zone-file
    /// syntax, e.g. `"a.example. 60 IN A 10.0.0.1"` (see [`unbound_big_txt`]).
    /// Several lines with the same name and type form one RRset.
    pub fn start(ns: &Netns, listen: IpAddr, local_data: &[&str]) -> Unbound {
        Unbound::start_with(ns, &[listen], &["example."], local_data, "")
    }

    /// Full form: listen addresses, the static zones, the local data, and
    /// extra lines for the `server:` clause (indented by you or not).
    pub fn start_with(
        ns: &Netns,
        listen: &[IpAddr],
        static_zones: &[&str],
        local_data: &[&str],
        extra_server_conf: &str,
    ) -> Unbound {
        assert!(!listen.is_empty(), "unbound needs a listen address");
        let dir = TempDir::new("unbound");
        let mut conf = String::from("server:\n");
        for ip in listen {
            conf.push_str(&format!("  interface: {ip}\n"));
        }
        conf.push_str(&format!(
            concat!(
                "  port: 53\n",
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

        let cmd = ns.exec(
            "unbound",
            [OsStr::new("-d"), OsStr::new("-c"), conf_path.as_os_str()],
        );
        let (mut child, log) = spawn_logged(cmd, "unbound");
        for ip in listen {
            // `invalid.` is one of unbound's built-in local zones: answered
            // at once, whatever the configured zones.
            wait_until_answering(
                &format!("unbound (config:\n{conf})"),
                ns,
                dns53(*ip),
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
