//! How the TCP tasks reach a relay thread: letters in a locked list, and an eventfd in the
//! thread's epoll set that says "look". The thread takes all letters at once, so a burst costs
//! one wake-up, and the lock is held only to push or swap a list.

use std::io;
use std::sync::{Arc, Mutex};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::mpsc;

use crate::engine::{ConnId, Failure, Leg};

/// What a TCP task tells the relay thread that owns its engine.
#[derive(Debug)]
pub enum Letter {
    /// A client connection opened; its replies go to `replies` (an empty message means "no
    /// reply will come for one query": it was dropped).
    TcpOpened {
        conn: ConnId,
        replies: mpsc::Sender<Vec<u8>>,
    },
    TcpQuery {
        conn: ConnId,
        query: Vec<u8>,
    },
    /// The connection is done; replies still to come for it are thrown away.
    TcpClosed {
        conn: ConnId,
    },
    /// A message read on an upstream TCP exchange.
    UpstreamReply {
        leg: Leg,
        reply: Vec<u8>,
    },
    /// An upstream TCP exchange broke before its reply.
    UpstreamFailed {
        leg: Leg,
        failure: Failure,
    },
}

pub struct Mailbox {
    letters: Mutex<Vec<Letter>>,
    wake: EventFd,
}

impl Mailbox {
    pub fn new() -> io::Result<Arc<Mailbox>> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Arc::new(Mailbox {
            letters: Mutex::new(Vec::new()),
            wake,
        }))
    }

    pub fn post(&self, letter: Letter) {
        let mut letters = self.letters.lock().unwrap_or_else(|p| p.into_inner());
        let first = letters.is_empty();
        letters.push(letter);
        drop(letters);
        // Only the first letter of a batch needs to wake the thread: it takes them all.
        if first {
            let _ = self.wake.write(1);
        }
    }

    /// Moves every letter into `into` (which should be empty).
    pub fn take(&self, into: &mut Vec<Letter>) {
        // Reset the eventfd before taking, so a letter posted after the swap wakes us again.
        let _ = self.wake.read();
        let mut letters = self.letters.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *letters, into);
    }

    /// What the relay thread's epoll waits on.
    pub fn fd(&self) -> &EventFd {
        &self.wake
    }
}
