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
    // Read stdout on a thread so a large output cannot fill the pipe and stall the child; the
    // end of its stdout is (nearly always) its exit, so we learn of it at once rather than at the
    // next look of a polling loop (each tool run is on the path to READY=1 at a takeover).
    let mut stdout = child.stdout.take().expect("piped");
    let (done, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        let _ = done.send(out);
    });
    let deadline = Instant::now() + timeout;
    let finished = read.recv_timeout(timeout).ok().and_then(|out| {
        // A child that closed its stdout but runs on still gets the rest of the budget.
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some((out, status)),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => return None,
            }
        }
    });
    let Some((out, status)) = finished else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{} did not finish within {timeout:?}", shown()));
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        return Err(format!("{} failed ({status}): {}", shown(), err.trim()));
    }
    String::from_utf8(out).map_err(|_| format!("{} printed something that is not UTF-8", shown()))
}

/// What a thread that panicked yields (its panic was printed already).
fn panicked<T>(_: Box<dyn std::any::Any + Send>) -> Result<T, String> {
    Err("a discovery thread panicked".into())
}

/// Runs `a` and `b` at once (each typically waits on a tool) and returns both results: the first
/// look for upstreams is on the way to READY=1 at a takeover, and tool runs cost milliseconds
/// each. A closure that panics yields `Err`.
pub fn side_by_side<A: Send, B: Send>(
    a: impl FnOnce() -> Result<A, String> + Send,
    b: impl FnOnce() -> Result<B, String> + Send,
) -> (Result<A, String>, Result<B, String>) {
    std::thread::scope(|s| {
        let b = s.spawn(b);
        let a = a();
        (a, b.join().unwrap_or_else(panicked))
    })
}

/// `f` over every item at once, at most `MAX_AT_ONCE` in flight; results in the items' order.
pub fn each_at_once<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> Result<R, String> + Sync,
) -> Vec<Result<R, String>> {
    /// Tool processes one look may run at once (kube-dns has a handful of endpoints).
    const MAX_AT_ONCE: usize = 8;
    let f = &f;
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(MAX_AT_ONCE) {
        std::thread::scope(|s| {
            let running: Vec<_> = chunk.iter().map(|item| s.spawn(move || f(item))).collect();
            for r in running {
                out.push(r.join().unwrap_or_else(panicked));
            }
        });
    }
    out
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

    #[test]
    fn runs_side_by_side_in_order() {
        let started = Instant::now();
        let (a, b) = side_by_side(
            || run("sleep", &["0.3"], TOOL_TIMEOUT).map(|_| 1),
            || run("sleep", &["0.3"], TOOL_TIMEOUT).map(|_| 2),
        );
        assert_eq!((a, b), (Ok(1), Ok(2)));
        let items: Vec<u32> = (0..10).collect();
        let out = each_at_once(&items, |&i| {
            run("sleep", &["0.3"], TOOL_TIMEOUT)?;
            if i == 3 {
                Err(format!("item {i}"))
            } else {
                Ok(i * 2)
            }
        });
        assert_eq!(out[2], Ok(4));
        assert_eq!(out[3], Err("item 3".to_string()));
        assert_eq!(out[9], Ok(18));
        // Three rounds of 0.3 s at most (8 at once), not twelve.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
