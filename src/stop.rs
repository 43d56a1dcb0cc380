//! The one way anything in the daemon is told to stop: an eventfd that, once written, stays
//! readable. The relay threads keep it in their epoll set, the standby's thread in its poll, and
//! tokio tasks await it through the runtime's reactor, so each wakes at once wherever it sleeps.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub struct Stop(EventFd);

impl Stop {
    pub fn new() -> io::Result<Arc<Stop>> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Arc::new(Stop(fd)))
    }

    pub fn stop(&self) {
        let _ = self.0.write(1);
    }

    /// Readable from the stop on (nothing ever reads it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Completes at the stop. Each call registers a descriptor of its own with the reactor (one
    /// descriptor is registered once): a loop keeps one such future pinned, not one per turn.
    /// A wake is believed only once poll(2) confirms it; out of descriptors, it looks every 50 ms.
    pub async fn stopped(&self) {
        let registered = self.0.as_fd().try_clone_to_owned().and_then(|fd| {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same until dropped.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(Into::into)
        });
        while !self.is_stopped() {
            match &registered {
                Ok(fd) => match fd.readable().await {
                    Ok(mut ready) => ready.clear_ready(),
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                },
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    pub fn is_stopped(&self) -> bool {
        let mut fds = [PollFd::new(self.fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
    }
}

/// Runs `work` until it ends or the stop comes, whichever is first.
pub async fn until(stop: Arc<Stop>, work: impl std::future::Future<Output = ()>) {
    tokio::select! {
        () = work => {}
        () = stop.stopped() => {}
    }
}
