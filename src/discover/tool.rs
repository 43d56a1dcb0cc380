//! Running the node's own tools (iptables, nft, ipvsadm) with a time limit.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a discovery tool may run: iptables waits for the xtables lock (`-w`), and a wedged tool
/// must not wedge discovery.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `program args` and returns its stdout. A missing program, a non-zero exit or a run past
/// `timeout` is an error sentence naming the command.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    let shown = || format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{program} is not installed"),
            _ => format!("cannot run {}: {e}", shown()),
        })?;
    // Read stdout on a thread so a large output cannot fill the pipe and stall the child.
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} did not finish within {timeout:?}", shown()));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", shown())),
        }
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        return Err(format!("{} failed ({status}): {}", shown(), err.trim()));
    }
    String::from_utf8(out).map_err(|_| format!("{} printed something that is not UTF-8", shown()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_missing_failing_and_slow_tools() {
        assert!(
            run("no-such-tool-here", &[], TOOL_TIMEOUT)
                .unwrap_err()
                .contains("not installed")
        );
        assert!(
            run("false", &[], TOOL_TIMEOUT)
                .unwrap_err()
                .contains("failed")
        );
        let slow = run("sleep", &["5"], Duration::from_millis(100)).unwrap_err();
        assert!(slow.contains("did not finish"), "{slow}");
        assert_eq!(run("echo", &["hi"], TOOL_TIMEOUT).unwrap(), "hi\n");
    }
}
