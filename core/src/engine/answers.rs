//! How a query ends for its askers: a fresh answer, the cache's (fresh or stale), the error an
//! upstream gave, or SERVFAIL, each made into every asker's own answer.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::outbox::Outbox;
use super::pending::Pending;
use super::{
    Client, Dest, Engine, Event, FAILURE_MEMORY, Map, RECHECK_CAP, RELAXED, TCP_MAX_MESSAGE,
};
use crate::answer;
use crate::cache::{Cache, Key};
use crate::wire::{self, rcode};

impl Engine {
    pub(super) fn stale_timer(&mut self, slot: u32, now: Instant) {
        let p = self.pending(slot);
        let Some(key) = p.key.clone().filter(|_| p.has_askers() && !p.stale_served) else {
            return;
        };
        if !self.stale_answer(&key, now) {
            return;
        }
        let mut p = self.slots[slot as usize].pending.take().expect("checked");
        self.serve_stale_to_all(&p);
        p.client = None;
        p.followers.clear();
        p.stale_served = true;
        self.slots[slot as usize].pending = Some(p);
    }

    /// Nothing is left to try: a stale answer if the cache has one (RFC 8767), else the error an
    /// upstream answered, else SERVFAIL.
    pub(super) fn give_up(&mut self, slot: u32, now: Instant) {
        let Some(p) = self.release(slot, now) else {
            return;
        };
        if let Some(key) = &p.key {
            remember(&mut self.recheck, key, now, self.settings.stale_recheck);
            if p.error_reply.is_none() {
                remember(&mut self.unanswered, key, now, FAILURE_MEMORY);
            }
            if p.has_askers() && self.stale_answer(key, now) {
                self.serve_stale_to_all(&p);
                return;
            }
        }
        for (client, query, q) in p.askers() {
            match &p.error_reply {
                Some(reply) => deliver(&mut self.outbox, reply, client, query, q),
                None => self.reply_local(client, query, q, rcode::SERVFAIL),
            }
        }
    }

    /// The stale answer in `self.answer`, to everyone waiting on `p`.
    fn serve_stale_to_all(&mut self, p: &Pending) {
        let answers = p.askers().count();
        self.stats.stale.fetch_add(answers as u64, RELAXED);
        self.events.push_back(Event::ServedStale { answers });
        for (client, query, q) in p.askers() {
            deliver(&mut self.outbox, &self.answer, client, query, q);
        }
    }

    /// Copies a servable cached answer (expired or not), every TTL the stale one, into
    /// `self.answer`: for when upstreams have failed.
    pub(super) fn stale_answer(&mut self, key: &Key, now: Instant) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|cache| lock(cache).get_stale(key, now, &mut self.answer))
    }

    /// The stale answer in `self.answer`, to one client now.
    pub(super) fn serve_stale_to(&mut self, client: Client, query: &[u8], q: &wire::Query) {
        self.stats.stale.fetch_add(1, RELAXED);
        self.events.push_back(Event::ServedStale { answers: 1 });
        deliver(&mut self.outbox, &self.answer, client, query, q);
    }
}

/// Remembers `key` failing at `now`, at most `RECHECK_CAP` names: when full, memories older than
/// `keep` go first, then all.
fn remember(memory: &mut Map<Key, Instant>, key: &Key, now: Instant, keep: Duration) {
    if memory.len() >= RECHECK_CAP {
        memory.retain(|_, t| now.saturating_duration_since(*t) < keep);
        if memory.len() >= RECHECK_CAP {
            memory.clear();
        }
    }
    memory.insert(key.clone(), now);
}

/// Queues `reply` for a client as the answer to its own query: its ID, its spelling of the
/// question, and cut to fit what it can take.
pub(super) fn deliver(
    outbox: &mut Outbox,
    reply: &[u8],
    client: Client,
    query: &[u8],
    q: &wire::Query,
) {
    let limit = reply_limit(client, q);
    outbox.push_with(Dest::Client(client), |out| {
        answer::for_asker(reply, query, q, limit, out);
    });
}

/// The largest reply a client may be sent.
pub(super) fn reply_limit(client: Client, q: &wire::Query) -> usize {
    match client {
        Client::Udp(_) => usize::from(q.udp_size),
        Client::Tcp(_) => TCP_MAX_MESSAGE,
    }
}

/// A poisoned lock only means another thread panicked mid-update of plain data; the cache is
/// still usable, and DNS service matters more than the entry that thread was writing.
pub(super) fn lock(cache: &Mutex<Cache>) -> std::sync::MutexGuard<'_, Cache> {
    cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
