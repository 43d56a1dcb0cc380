//! The command line as an operator meets it: bad flags are one clear line and exit 2. These runs
//! end before any socket is opened, so they need no namespace.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_localdns-fallback"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    for (args, needle) in [
        (&["--bogus"][..], "unknown argument \"--bogus\""),
        (&["--node-upstream", "not-an-ip"], "\"not-an-ip\""),
        (
            &["--query-timeout", "soon", "--node-upstream", "198.18.0.1"],
            "\"soon\"",
        ),
        (&["--cluster-upstream", "169.254.10.11"], "loop"),
        (&["--discovery", "dns-magic"], "\"dns-magic\""),
        (&["--node-listen", "0.0.0.0:53"], "wildcard"),
    ] {
        let (code, stdout, stderr) = run(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn help_lists_every_flag_and_version_prints() {
    let (code, help, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--node-listen",
        "--cluster-listen",
        "--node-upstream",
        "--cluster-upstream",
        "--cluster-domain",
        "--upstream-timeout",
        "--query-timeout",
        "--max-inflight",
        "--max-tcp-connections",
        "--tcp-idle-timeout",
        "--upstream-sockets",
        "--udp-threads",
        "--bind-timeout",
        "--log-level",
        "--resolv-conf",
        "--dhcp-leases",
        "--discovery",
        "--kube-dns-service",
        "--cluster-ip",
        "--cilium-socket",
        "--rediscover-interval",
        "--json",
        "--metrics",
        "--no-link-setup",
        "--allow-wildcard",
        "--cache-size",
        "--cache-bytes",
        "--cache-min-ttl",
        "--cache-max-ttl",
        "--serve-stale",
    ] {
        assert!(help.contains(flag), "help mentions {flag}");
    }
    let (code, version, _) = run(&["--version"]);
    assert_eq!(code, 0);
    // "(commit ...)" follows; tests/shipping.rs checks that it names HEAD.
    assert!(
        version.starts_with(&format!(
            "localdns-fallback {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );
}

/// The README is where a node engineer looks a flag up: its flag table must hold exactly the
/// flags `--help` lists, each with the same value form and the same default (both come from the
/// one definition in src/cli.rs, whose unit tests hold the parser to it).
#[test]
fn the_readme_flag_table_agrees_with_help() {
    let (code, help, _) = run(&["--help"]);
    assert_eq!(code, 0);
    // "    --name VALUE   help text [default: X]"
    let from_help: std::collections::BTreeMap<String, String> = help
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let (head, rest) = l.split_once("  ")?;
            let default = rest.rsplit_once("[default: ")?.1.strip_suffix(']')?;
            Some((head.to_string(), default.to_string()))
        })
        .collect();
    assert!(from_help.len() > 25, "flags read off --help: {from_help:?}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    // "| `--name VALUE` | `X` | meaning |"
    let from_readme: std::collections::BTreeMap<String, String> = readme
        .split("\n## Flags")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a ## Flags section")
        .lines()
        .filter_map(|l| {
            let mut cells = l
                .strip_prefix('|')?
                .split('|')
                .map(|c| c.trim().trim_matches('`'));
            let head = cells.next()?;
            let default = cells.next()?;
            let flag = head.strip_prefix("--")?;
            (flag.starts_with(|c: char| c.is_ascii_alphabetic()) && !default.is_empty())
                .then(|| (head.to_string(), default.to_string()))
        })
        .collect();
    assert_eq!(
        from_readme, from_help,
        "README's flag table (left) and --help (right) differ"
    );
}
