//! What a history must show (see the module's doc), one check a function: every client's one
//! reply in the budget, the caps, then each reply by what it carries (records, an upstream's
//! error, a truncated answer, REFUSED, SERVFAIL), liveness, an outage's hedges and the cache.

use std::collections::HashMap;

use super::*;

pub(super) fn judge(h: &History) -> Result<(), String> {
    let j = Judge::new(h)?;
    j.caps()?;
    for i in 0..h.clients.len() {
        j.client(i)?;
    }
    j.outage_hedges()?;
    j.fresh_answers_at_once()
}

/// A history and what the checks look up often.
struct Judge<'a> {
    h: &'a History,
    idx: Index,
    /// The sends of each listener and key, in order.
    by_key: HashMap<(usize, MKey), Vec<usize>>,
    /// Did this client's query start one of its own (a try went out as it was asked)?
    first_askers: Vec<bool>,
    /// Each client: (ms, step) of its one reply.
    answered: Vec<(u64, usize)>,
    cap: usize,
    default_cap: bool,
    udp: bool,
}

/// One client's reply and what the checks of it share.
struct Case<'a> {
    i: usize,
    c: &'a Client0,
    what: What,
    t: u64,
    st: usize,
    at_once: bool,
    truncated: bool,
    code: u8,
    m: Mark,
    g: usize,
    first_asker: bool,
    /// Tries sent for its own query.
    tries: usize,
    /// Its group's set stayed the same from 4 s before it until its budget ran out.
    stable: bool,
    /// Valid replies the engine could take for its own query before its reply.
    reached: Vec<&'a Heard>,
    /// No other client of its listener waited on the same key with it (or the cache is on).
    alone: bool,
}

/// Sends for client `c`'s own query, answered at step `st`: the same listener and key, from when
/// it asked.
fn own(c: &Client0, st: usize, s: &Sent) -> bool {
    s.engine == c.engine && s.key == c.key && s.step >= c.step && s.step <= st
}

impl Case<'_> {
    fn own(&self, s: &Sent) -> bool {
        own(self.c, self.st, s)
    }

    fn same_name(&self, s: &Sent) -> bool {
        s.key.group == self.g && s.key.nid == self.c.key.nid
    }
}

impl<'a> Judge<'a> {
    fn new(h: &'a History) -> Result<Judge<'a>, String> {
        let mut idx = Index {
            sent_by_server: vec![Vec::new(); h.servers.len()],
            heard_by_server: vec![Vec::new(); h.servers.len()],
        };
        for (i, s) in h.sent.iter().enumerate() {
            idx.sent_by_server[s.server].push(i);
        }
        for (i, r) in h.heard.iter().enumerate() {
            idx.heard_by_server[h.sent[r.sent].server].push(i);
        }
        let mut by_key: HashMap<(usize, MKey), Vec<usize>> = Default::default();
        for (i, s) in h.sent.iter().enumerate() {
            by_key.entry((s.engine, s.key)).or_default().push(i);
        }
        let mut j = Judge {
            h,
            idx,
            by_key,
            first_askers: Vec::new(),
            answered: Vec::with_capacity(h.clients.len()),
            cap: h.max_inflight,
            default_cap: h.max_inflight == Settings::default().max_inflight,
            udp: h.transport == Transport::Udp,
        };
        j.first_askers = (h.clients.iter())
            .map(|c| j.sends_of(c).iter().any(|&k| h.sent[k].step == c.step))
            .collect();
        for (i, c) in h.clients.iter().enumerate() {
            let what = What(i, c.key.nid, c.at);
            let [(t, st, _)] = c.got.as_slice() else {
                return Err(format!("{what}: {} replies", c.got.len()));
            };
            if *t > c.at + h.budget + MAX_LATE {
                return Err(format!("{what}: answered at {t} ms, past the budget"));
            }
            j.answered.push((*t, *st));
        }
        Ok(j)
    }

    fn sends_of(&self, c: &Client0) -> &[usize] {
        self.by_key
            .get(&(c.engine, c.key))
            .map_or(&[][..], |v| v.as_slice())
    }

    fn waiting_at(&self, c: &Client0, step: usize, i: usize) -> bool {
        c.step <= step && self.answered[i].1 > step
    }

    /// The queries in flight on `engine` at `step` by the clients waiting (one per key with the
    /// cache on), but `except`: per group, and their keys.
    fn waiting(
        &self,
        engine: usize,
        step: usize,
        except: Option<usize>,
    ) -> ([usize; 2], Vec<MKey>) {
        let mut per_group = [0usize; 2];
        let mut keys: Vec<MKey> = Vec::new();
        for (j, d) in self.h.clients.iter().enumerate() {
            if Some(j) != except
                && d.engine == engine
                && self.waiting_at(d, step, j)
                && !(self.h.cache && keys.contains(&d.key))
            {
                keys.push(d.key);
                per_group[d.key.group] += 1;
            }
        }
        (per_group, keys)
    }

    /// Queries in flight never over the caps: every client waiting (one query per key with the
    /// cache on, per client without) is a query in flight.
    fn caps(&self) -> Result<(), String> {
        let cap = self.cap;
        for c in self.h.clients.iter().filter(|_| !self.default_cap) {
            let (per_group, _) = self.waiting(c.engine, c.step, None);
            if per_group[c.key.group] > cap - cap / 4 || per_group.iter().sum::<usize>() > cap {
                return Err(format!(
                    "{} ms: {per_group:?} queries in flight on one listener, over the cap {cap}",
                    c.at
                ));
            }
        }
        Ok(())
    }

    fn client(&self, i: usize) -> Result<(), String> {
        let h = self.h;
        let c = &h.clients[i];
        let what = What(i, c.key.nid, c.at);
        let (t, st) = self.answered[i];
        let reply = &c.got[0].2[..];
        let q = wire::parse_query(&c.query).expect("ours");
        fields(&what, c, reply, &q)?;
        if let Some(rdata) = h.hosts_answer(c) {
            return self.hosts_file(&what, i, reply, &q, &rdata);
        }
        let own = |s: &Sent| own(c, st, s);
        let g = c.key.group;
        let k = Case {
            i,
            c,
            t,
            st,
            at_once: st == c.step,
            truncated: wire::is_truncated(reply),
            code: wire::rcode(reply),
            m: mark(reply),
            g,
            first_asker: self.first_askers[i],
            tries: self
                .sends_of(c)
                .iter()
                .filter(|&&k| own(&h.sent[k]))
                .count(),
            stable: h.set_stable(g, c.at.saturating_sub(4_000), c.at + h.budget),
            reached: (h.heard.iter())
                .filter(|r| r.taken(h) && r.step < st && own(&h.sent[r.sent]))
                .collect(),
            alone: h.cache
                || !h.clients.iter().enumerate().any(|(j, d)| {
                    j != i
                        && d.engine == c.engine
                        && d.key == c.key
                        && d.step <= st
                        && self.answered[j].1 >= c.step
                }),
            what,
        };
        let answer_grade = match k.m {
            Mark::Answer { .. } | Mark::Negative { .. } => {
                self.records(&k)?;
                true
            }
            Mark::Error { group, nid } => {
                self.error(&k, group, nid)?;
                false
            }
            Mark::Bare if k.truncated => {
                self.truncated(&k)?;
                false
            }
            Mark::Bare if k.code == rcode::REFUSED => {
                self.refused(&k)?;
                false
            }
            Mark::Bare if k.code == rcode::SERVFAIL => {
                self.servfail(&k)?;
                false
            }
            _ => return Err(format!("{}: RCODE {}, {:?}", k.what, k.code, k.m)),
        };
        self.liveness(&k, answer_grade)?;
        self.down_at_once(&k)?;
        self.through_death(&k, answer_grade)
    }

    /// From the hosts file: at once, authoritative, its records with TTL 5, nothing sent.
    fn hosts_file(
        &self,
        what: &What,
        i: usize,
        reply: &[u8],
        q: &wire::Query,
        rdata: &[Vec<u8>],
    ) -> Result<(), String> {
        let records = wire::records(reply).unwrap_or_default();
        let got: Vec<&[u8]> = records
            .iter()
            .filter(|r| r.section == wire::Section::Answer)
            .filter(|r| r.rtype == q.qtype && r.ttl == route::HOSTS_TTL)
            .map(|r| &reply[r.ttl_offset + 6..])
            .collect();
        let fits = got.len() == rdata.len() && got.iter().zip(rdata).all(|(g, w)| g.starts_with(w));
        let [_, an, ns, _] = wire::counts(reply);
        let at_once = self.answered[i].1 == self.h.clients[i].step;
        if !at_once || self.first_askers[i] || reply[2] & 0x06 != 0x04 || wire::rcode(reply) != 0 {
            return Err(format!(
                "{what}: not the hosts file's answer at once: {reply:02x?}"
            ));
        }
        if !fits || usize::from(an) != rdata.len() || ns != 0 {
            return Err(format!(
                "{what}: the hosts file says {rdata:?}: {reply:02x?}"
            ));
        }
        Ok(())
    }

    /// Records (an answer or a denial): as an upstream gave them, fresh or stale in their time.
    fn records(&self, k: &Case) -> Result<(), String> {
        let (h, what, t, code) = (self.h, &k.what, k.t, k.code);
        let (Mark::Answer {
            group,
            version,
            nid,
            ttl,
        }
        | Mark::Negative {
            group,
            version,
            nid,
            ttl,
        }) = k.m
        else {
            unreachable!("records are an answer or a denial")
        };
        let negative = matches!(k.m, Mark::Negative { .. });
        if usize::from(group) != k.g || usize::from(nid) != k.c.key.nid {
            return Err(format!("{what}: the records of group {group} name n{nid}"));
        }
        if code
            != if negative && code == rcode::NXDOMAIN {
                rcode::NXDOMAIN
            } else {
                rcode::NOERROR
            }
            || k.truncated
        {
            return Err(format!(
                "{what}: RCODE {code} TC {} with {:?}",
                k.truncated, k.m
            ));
        }
        let (record_ttl, minimum) = h.ttls[k.g][k.c.key.nid];
        let keep = if negative {
            record_ttl.min(minimum)
        } else {
            record_ttl
        };
        let fresh_for = (u64::from(keep) * 1000).max(MIN_TTL_MS);
        let mut stale = false;
        let fits = h.heard.iter().any(|r| {
            let s = &h.sent[r.sent];
            let kind_fits = match r.kind {
                Kind::Answer => !negative,
                Kind::NxDomain => negative && code == rcode::NXDOMAIN,
                Kind::NoData => negative && code == rcode::NOERROR,
                _ => false,
            };
            if !kind_fits || r.truncated || r.version != version || !k.same_name(s) || r.step > k.st
            {
                return false;
            }
            let age = t - r.at;
            let counted = if r.ttl == 0 {
                0
            } else {
                r.ttl.saturating_sub((age / 1000) as u32).max(1)
            };
            if age < fresh_for && ttl == counted {
                return true;
            }
            if ttl == crate::cache::STALE_TTL && age <= fresh_for + MAX_STALE_MS && h.cache {
                stale = true;
                return true;
            }
            false
        });
        if !fits {
            return Err(format!(
                "{what}: {:?} at {t} ms matches no upstream answer (fresh for {fresh_for} ms, stale {MAX_STALE_MS} ms more)",
                k.m
            ));
        }
        // A stale answer while the query's own try brought a fresh one.
        if stale && !k.at_once && k.alone {
            if let Some(r) = k.reached.iter().find(|r| r.kind.answers() && !r.truncated) {
                return Err(format!(
                    "{what}: stale at {t} ms, though an answer reached its query at {} ms",
                    r.at
                ));
            }
        }
        Ok(())
    }

    /// An upstream's SERVFAIL or REFUSED: one an upstream gave, passed on only once the others
    /// were asked or there was no time or try left.
    fn error(&self, k: &Case, group: u8, nid: u8) -> Result<(), String> {
        let (h, what, t, code) = (self.h, &k.what, k.t, k.code);
        let kind = match code {
            rcode::SERVFAIL => Kind::ServFail,
            rcode::REFUSED => Kind::Refused,
            _ => return Err(format!("{what}: an error record with RCODE {code}")),
        };
        if usize::from(group) != k.g || usize::from(nid) != k.c.key.nid {
            return Err(format!("{what}: the error of group {group} name n{nid}"));
        }
        if !h.heard.iter().any(|r| {
            r.kind == kind && !r.truncated && r.step <= k.st && k.same_name(&h.sent[r.sent])
        }) {
            return Err(format!("{what}: RCODE {code} no upstream gave"));
        }
        // An error leaves time to ask another server: it must be asked.
        let c = k.c;
        let asked_all = (h.set_at(k.g, c.at).iter())
            .all(|&sv| h.sent.iter().any(|s| k.own(s) && s.server == sv));
        if k.first_asker
            && !asked_all
            && k.tries < MAX_TRIES
            && t + MAX_LATE + 10 < c.at + h.budget
            && h.set_stable(k.g, c.at, t)
        {
            return Err(format!(
                "{what}: an upstream's error passed on at {t} ms, another server never asked ({} tries)",
                k.tries
            ));
        }
        Ok(())
    }

    /// An upstream's truncated answer, passed on only with no try or time left, and not while
    /// its own fetch over TCP may still bring the whole answer.
    fn truncated(&self, k: &Case) -> Result<(), String> {
        let (h, what, t, c) = (self.h, &k.what, k.t, k.c);
        if !self.udp
            || !(h.heard.iter())
                .any(|r| r.truncated && r.step <= k.st && k.same_name(&h.sent[r.sent]))
        {
            return Err(format!("{what}: TC no upstream gave"));
        }
        if k.first_asker && k.tries < MAX_TRIES && t < c.at + h.budget {
            return Err(format!(
                "{what}: a truncated answer passed on at {t} ms, not fetched over TCP"
            ));
        }
        let fetching = self.sends_of(c).iter().map(|&j| &h.sent[j]).find(|s| {
            k.own(s)
                && s.leg.via == Via::Tcp
                && s.step < k.st
                && t < s.at + h.try_time
                && s.answered.is_none_or(|r| r > t)
                && s.ended.is_none_or(|e| e > t)
        });
        if let Some(f) = fetching.filter(|_| k.alone) {
            return Err(format!(
                "{what}: a truncated answer passed on at {t} ms, its fetch over TCP (at {} ms) still out",
                f.at
            ));
        }
        Ok(())
    }

    /// Shed: only over a cap. Queries in flight are at most: the keys waiting, and those with a
    /// try possibly still out (a refresh nobody waits on).
    fn refused(&self, k: &Case) -> Result<(), String> {
        let (h, c, cap) = (self.h, k.c, self.cap);
        let (mut per_group, mut keys) = self.waiting(c.engine, c.step, Some(k.i));
        for s in &h.sent {
            let out = s.step < c.step
                && s.at + h.try_time + MAX_LATE >= c.at
                && s.answered.is_none_or(|r| r >= c.at)
                && s.ended.is_none_or(|r| r >= c.at);
            if s.engine == c.engine && out && !(h.cache && keys.contains(&s.key)) {
                if h.cache {
                    keys.push(s.key);
                }
                per_group[s.key.group] += 1;
            }
        }
        if !k.at_once || (per_group[k.g] < cap - cap / 4 && per_group.iter().sum::<usize>() < cap) {
            return Err(format!(
                "{}: REFUSED with at most {per_group:?} in flight, cap {cap}",
                k.what
            ));
        }
        Ok(())
    }

    /// SERVFAIL made here: at once only for a name just unanswered or a group possibly down;
    /// later only where no reply reached the query.
    fn servfail(&self, k: &Case) -> Result<(), String> {
        let (h, c) = (self.h, k.c);
        if k.at_once {
            let name_failed = name_failed_lately(h, c);
            let down = (h.set_at(k.g, c.at).iter())
                .all(|&sv| silent(h, &self.idx, sv, c.at, c.step, false));
            if !name_failed && !down && !h.set_at(k.g, c.at).is_empty() {
                return Err(format!(
                    "{}: SERVFAIL at once with a server not shown silent",
                    k.what
                ));
            }
        } else if k.alone {
            if let Some(r) = k.reached.iter().find(|r| !r.truncated) {
                return Err(format!(
                    "{}: SERVFAIL made here at {} ms, though an upstream's reply (try#{}) reached its query at {} ms",
                    k.what, k.t, r.sent, r.at
                ));
            }
        }
        Ok(())
    }

    /// A clean server that answers the name in time: the client gets an answer.
    fn liveness(&self, k: &Case, answer_grade: bool) -> Result<(), String> {
        let (h, c, udp, try_time) = (self.h, k.c, self.udp, self.h.try_time);
        if !self.default_cap || !k.stable {
            return Ok(());
        }
        let set = h.set_at(k.g, c.at);
        let from = c.at.saturating_sub(4_000);
        let fast = try_time - 2 * MAX_LATE - 10;
        let clean = set.iter().find(|&&x| {
            let s = &h.servers[x];
            s.names[c.key.nid].kind.answers() && s.clean(from, c.at + h.budget, fast, udp)
        });
        let Some(&x) = clean else {
            return Ok(());
        };
        let tries_of = |b: &Behaviour| if b.truncates && udp { 2 } else { 1 };
        let others = (set.iter())
            .filter(|&&y| y != x)
            .map(|&y| &h.servers[y].names[c.key.nid]);
        let x_b = &h.servers[x].names[c.key.nid];
        // A hedge may take a try, and a hedge or a retry may go to a server tried already (one
        // that just refused): a try to spare for each.
        let tries_needed: usize = others.clone().map(tries_of).sum::<usize>() + tries_of(x_b) + 2;
        let time_needed: u64 = others.map(|b| try_time * tries_of(b) as u64).sum::<u64>()
            + cost(x_b, udp)
            + (set.len() as u64 + 1) * MAX_LATE
            + 20;
        if tries_needed <= MAX_TRIES && time_needed < h.budget && !answer_grade {
            return Err(format!(
                "{}: {:?} RCODE {} at {} ms, though {} answers it in {} ms",
                k.what, k.m, k.code, k.t, h.servers[x].addr, x_b.delay
            ));
        }
        Ok(())
    }

    /// A group down on the evidence is answered at once.
    fn down_at_once(&self, k: &Case) -> Result<(), String> {
        let (h, c) = (self.h, k.c);
        if self.default_cap && h.set_stable(k.g, c.at.saturating_sub(4_000), c.at) {
            let set = h.set_at(k.g, c.at);
            if !set.is_empty()
                && (set.iter()).all(|&sv| silent(h, &self.idx, sv, c.at, c.step, true))
                && !k.at_once
            {
                return Err(format!(
                    "{}: its group down on the evidence, answered only at {} ms",
                    k.what, k.t
                ));
            }
        }
        Ok(())
    }

    /// Through a backend's death with the other healthy: within 100 ms.
    fn through_death(&self, k: &Case, answer_grade: bool) -> Result<(), String> {
        let c = k.c;
        if self.h.death == Some(k.g) && (k.t - c.at > DEATH_BOUND_MS + MAX_LATE || !answer_grade) {
            return Err(format!(
                "{}: {:?} after {} ms, one backend dead, the other healthy",
                k.what,
                k.m,
                k.t - c.at
            ));
        }
        Ok(())
    }

    /// A full outage under bursts: hedges stay within their budget. Each new query earns a fifth
    /// of a hedge, 50 are saved up at most, and a probe's hedge is free (a probe per server per
    /// 500 ms). A hedge is a send when a timer fires while another try for the key is out, and
    /// not a move on after a whole try budget.
    fn outage_hedges(&self) -> Result<(), String> {
        let (h, try_time) = (self.h, self.h.try_time);
        let Some(died) = h.outage else {
            return Ok(());
        };
        let window = died..died + 2_000;
        let g = (h.sent.iter())
            .find(|s| h.servers[s.server].dies == Some(died))
            .map_or(0, |s| s.key.group);
        let probes = 2 * (window.end - window.start) as usize / 500 + 2;
        for e in 0..h.roles.len() {
            let started = (h.clients.iter())
                .filter(|c| c.engine == e && window.contains(&c.at))
                .count();
            let out_at = |p: &Sent, t: u64| {
                p.answered.is_none_or(|r| r > t) && p.ended.is_none_or(|x| x > t)
            };
            let hedges = (h.sent.iter())
                .filter(|s| {
                    s.engine == e
                        && s.key.group == g
                        && window.contains(&s.at)
                        && h.timer_steps[s.step - 1]
                })
                .filter(|s| {
                    let same = self.by_key[&(e, s.key)]
                        .iter()
                        .map(|&k| &h.sent[k])
                        .filter(|p| p.step < s.step && out_at(p, s.at));
                    let another_out = same.clone().any(|p| s.at < p.at + try_time);
                    let timed_out = same
                        .clone()
                        .any(|p| (p.at + try_time..=p.at + try_time + MAX_LATE).contains(&s.at));
                    another_out && !timed_out
                })
                .count();
            if hedges > 50 + started / 5 + probes {
                return Err(format!(
                    "an outage from {died} ms: {hedges} hedges for {started} new queries on listener {e}"
                ));
            }
        }
        Ok(())
    }

    /// A fresh cached answer is served at once; one expired but still servable stale comes by
    /// the client-response timer (RFC 8767).
    fn fresh_answers_at_once(&self) -> Result<(), String> {
        let h = self.h;
        if !h.cache {
            return Ok(());
        }
        for (j, d) in h.clients.iter().enumerate() {
            let (t1, _) = self.answered[j];
            let (ttl, kept, negative) = match mark(&d.got[0].2) {
                Mark::Answer { ttl, .. } => (ttl, h.ttls[d.key.group][d.key.nid].0, false),
                Mark::Negative { ttl, .. } => {
                    let (t, m) = h.ttls[d.key.group][d.key.nid];
                    (ttl, t.min(m), true)
                }
                _ => continue,
            };
            // Another server's answer of the other kind may have replaced it, kept for less.
            let replaced = h.heard.iter().any(|r| {
                let k = h.sent[r.sent].key;
                k.group == d.key.group
                    && k.nid == d.key.nid
                    && r.kind.answers()
                    && (r.kind == Kind::Answer) == negative
            });
            if replaced {
                continue;
            }
            let original = h.ttls[d.key.group][d.key.nid].0;
            if ttl <= 1 || ttl == crate::cache::STALE_TTL || original == 0 {
                continue;
            }
            // Stored at most this long before it was served: its TTL tells its age.
            let stored = t1.saturating_sub(u64::from(original - ttl + 1) * 1000);
            self.served_from(j, d, stored, kept, ttl)?;
        }
        Ok(())
    }

    /// The later clients of `d`'s key, against its answer stored at `stored` and kept `kept` s.
    fn served_from(
        &self,
        j: usize,
        d: &Client0,
        stored: u64,
        kept: u32,
        ttl: u32,
    ) -> Result<(), String> {
        let (h, t1) = (self.h, self.answered[j].0);
        let stale_after = Settings::default().stale_after.as_millis() as u64;
        let fresh_for = (u64::from(kept) * 1000).max(MIN_TTL_MS);
        let fresh_until = stored + fresh_for;
        for (i, c) in h.clients.iter().enumerate() {
            if c.key == d.key
                && c.step > self.answered[j].1
                && c.at + 1 < fresh_until
                && self.answered[i].1 != c.step
            {
                return Err(format!(
                    "q{i} for {} at {} ms: not answered at once, though q{j} got it fresh at {t1} ms (TTL {ttl})",
                    name_of(c.key.nid),
                    c.at
                ));
            }
            // Expired when asked, still servable when the client-response timer fires: the
            // stale answer comes then at the latest, if this client started the query.
            let timer = c.at + stale_after + MAX_LATE;
            if c.key == d.key
                && c.step > self.answered[j].1
                && c.at >= t1 + fresh_for
                && timer < stored + fresh_for + MAX_STALE_MS
                && self.first_askers[i]
                && self.answered[i].0 > timer
            {
                return Err(format!(
                    "q{i} for {} at {} ms: answered at {} ms, though q{j}'s answer (at {t1} ms) was there to serve stale",
                    name_of(c.key.nid),
                    c.at,
                    self.answered[i].0
                ));
            }
        }
        Ok(())
    }
}

/// The fields a client checks: its ID, QR and opcode, RD and CD, its question as asked, OPT and
/// DO.
fn fields(what: &What, c: &Client0, reply: &[u8], q: &wire::Query) -> Result<(), String> {
    let qlen = q.question_end;
    if reply.len() < qlen || reply[..2] != c.query[..2] {
        return Err(format!("{what}: not its ID"));
    }
    if reply[2] & 0x80 == 0 || reply[2] & 0x78 != 0 {
        return Err(format!("{what}: QR or opcode wrong"));
    }
    if reply[2] & 1 != c.query[2] & 1 || reply[3] & 0x10 != c.query[3] & 0x10 {
        return Err(format!("{what}: RD or CD not its own"));
    }
    if reply[4..6] != [0, 1] || reply[12..qlen] != c.query[12..qlen] {
        return Err(format!("{what}: not its question as asked"));
    }
    let (opt, dnssec_ok) = opt_of(reply);
    if opt != q.edns || dnssec_ok != q.dnssec_ok {
        return Err(format!(
            "{what}: OPT {opt} DO {dnssec_ok}, asked {} {}",
            q.edns, q.dnssec_ok
        ));
    }
    Ok(())
}
