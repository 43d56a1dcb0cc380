//! Seeded lifecycles of LocalDNS beside the standby's [`Flows`], on a fake clock: starts, slow
//! start-ups, crashes (addresses kept or deleted), hangs and resumes, quick restarts, a LocalDNS
//! that reads but does not answer, CPU-quota throttling, sockets joining and leaving, lost probe
//! replies, quiet and busy clients, and the standby itself restarted. The world here models the
//! kernel (which socket a new flow reaches, what waits in each queue) and carries out what the
//! machine says; the checks read only what the machine said and what the world did, never its
//! fields. After every step:
//! - each new flow reaches one socket, and a socket that does not serve gets one only within
//!   the detectors' bounds (the queues' from the first query left unread, else the probe's);
//! - the standby gives the flows back within two answered rounds of LocalDNS serving again;
//! - a LocalDNS that serves healthily is never taken from;
//! - throttled, the flows change hands at most once every [`UNREAD_REST`];
//! - the steering is pointed afresh within a look after the groups' members moved it.
//!
//! A failure names its seed; `FLOWS_SEED=<seed>` replays it, `FLOWS_LIFECYCLES=<n>` runs more.
//! Planted bugs this caught are listed in `planted.md` beside this file.

use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The shell's wait for a probe round.
const WAIT: Duration = Duration::from_millis(120);
const MS: Duration = Duration::from_millis(1);
/// Two silent rounds from any point: a round under way, the next one, and one asked at once.
const PROBE_BOUND: Duration = Duration::from_millis(500);
/// A look sees the first unread query at most a look late, the stall a busy look after it is old.
const QUEUE_BOUND: Duration = UNREAD_FOR
    .saturating_add(LOOK_EVERY)
    .saturating_add(LOOK_BUSY.saturating_mul(3))
    .saturating_add(MS);
const HAND_BACK_BOUND: Duration = Duration::from_millis(500);
/// After a resume, a round asked during the silence may still end silent.
const GRACE: Duration = WAIT.saturating_add(LOOK_EVERY).saturating_add(MS);
/// The longest a healthy socket's queue stays non-empty and growing (what `tests/unread.rs`
/// measures on the real thing, with margin below `UNREAD_FOR`).
const HEALTHY_RUN: Duration = Duration::from_millis(13);
const THROTTLE_PERIOD: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Serving,
    Hung,
    /// Reads, answers nothing.
    Mute,
    /// Bound, reading from `reads_at` on.
    Starting {
        reads_at: Instant,
    },
    /// Crashed: no socket.
    Absent,
    /// Frozen for the first `frozen` of every `THROTTLE_PERIOD` by its CPU quota.
    Throttled {
        frozen: Duration,
    },
}

#[derive(Debug)]
struct Sock {
    inode: u64,
    unread: u32,
    /// The healthy queue's current growing run, for its noise.
    run: Option<(Instant, u32)>,
}

struct Probe {
    asked: Instant,
    lost: bool,
}

struct World {
    rng: StdRng,
    now: Instant,
    flows: Flows,
    phase: Phase,
    phase_since: Instant,
    sockets: Vec<Sock>,
    next_inode: u64,
    addresses: bool,
    /// Where the steering points, as the machine's outs left it.
    target: Holder,
    /// Since when the members moved our index under the steering.
    stale: Option<Instant>,
    probe: Option<Probe>,
    last_lost: bool,
    answered_in_row: u32,
    lost_at: Option<Instant>,
    /// Observations for the checks.
    not_serving_since: Option<Instant>,
    first_unread: Option<Instant>,
    healthy_since: Option<Instant>,
    serving_since: Option<Instant>,
    rest_until: Option<Instant>,
    last_take: Option<Why>,
    taken_at: Option<Instant>,
    throttled_takes: Vec<Instant>,
    query_every: Option<Duration>,
    next_query: Instant,
    next_change: Instant,
    takes: u32,
    /// The shell cannot see LocalDNS's cgroup (no cgroup mount, another pid namespace).
    blind: bool,
    /// The hang in force is a SIGSTOP (else a blocked reader).
    stopped: bool,
}

impl World {
    fn reads(&self) -> bool {
        match self.phase {
            Phase::Serving | Phase::Mute => true,
            Phase::Hung | Phase::Absent => false,
            Phase::Starting { reads_at } => self.now >= reads_at,
            Phase::Throttled { frozen } => self.in_period() >= frozen,
        }
    }

    fn in_period(&self) -> Duration {
        let since = self.now - self.phase_since;
        Duration::from_nanos((since.as_nanos() % THROTTLE_PERIOD.as_nanos()) as u64)
    }

    fn serves(&self) -> bool {
        self.addresses
            && !self.sockets.is_empty()
            && matches!(self.phase, Phase::Serving | Phase::Throttled { .. })
    }

    fn answers_now(&self) -> bool {
        self.serves() && self.reads()
    }

    /// The phase's own next instant: a throttled LocalDNS thaws, a starting one reads.
    fn phase_event(&self) -> Option<Instant> {
        match self.phase {
            Phase::Starting { reads_at } if reads_at > self.now => Some(reads_at),
            Phase::Throttled { frozen } => {
                let at = self.in_period();
                Some(if at < frozen {
                    self.now + (frozen - at)
                } else {
                    self.now + (THROTTLE_PERIOD - at)
                })
            }
            _ => None,
        }
    }

    fn new_socket(&mut self) {
        self.next_inode += 1;
        self.sockets.push(Sock {
            inode: self.next_inode,
            unread: 0,
            run: None,
        });
    }

    /// Who serves changed: keep the observations in step.
    fn observe(&mut self) {
        let serves = self.serves();
        match (serves, self.not_serving_since) {
            (true, Some(_)) => self.not_serving_since = None,
            (false, None) => self.not_serving_since = Some(self.now),
            _ => {}
        }
        if self.reads() {
            self.first_unread = None;
            for s in &mut self.sockets {
                s.unread = 0;
            }
        }
        let healthy = serves && self.phase == Phase::Serving;
        match (healthy, self.healthy_since) {
            (true, None) => self.healthy_since = Some(self.now),
            (false, Some(_)) => self.healthy_since = None,
            _ => {}
        }
        match (serves, self.serving_since) {
            (true, None) => self.serving_since = Some(self.now),
            (false, Some(_)) => self.serving_since = None,
            _ => {}
        }
    }

    fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.phase_since = self.now;
        self.observe();
    }

    /// Sockets closing move the last member into the freed index: our steering is stale.
    fn close_sockets(&mut self, keep: usize) {
        if self.sockets.len() > keep {
            self.sockets.truncate(keep);
            self.stale.get_or_insert(self.now);
        }
    }

    fn carry_out(&mut self) -> Result<(), String> {
        while let Some(out) = self.flows.poll(self.now) {
            if TRACE.with(|t| *t) && !matches!(out, Out::Look { .. }) {
                eprintln!(
                    "{:?} {:?} {out:?} {:?} sockets {} rest {:?}",
                    self.now,
                    self.now - self.phase_since,
                    self.phase,
                    self.sockets.len(),
                    self.rest_until
                );
            }
            match out {
                Out::Take(why) => {
                    if let Some(h) = self.healthy_since {
                        if self.now - h > GRACE && self.phase == Phase::Serving && self.serves() {
                            return Err(format!(
                                "took the flows ({why:?}) from a LocalDNS healthy for {:?}",
                                self.now - h
                            ));
                        }
                    }
                    if let Phase::Throttled { .. } = self.phase {
                        if !self.blind && self.now - self.phase_since > GRACE {
                            return Err(format!(
                                "took the flows ({why:?}) from a LocalDNS throttled for {:?}",
                                self.now - self.phase_since
                            ));
                        }
                        if let Some(&last) = self.throttled_takes.last() {
                            if last >= self.phase_since && self.now - last < UNREAD_REST {
                                return Err(format!(
                                    "throttled LocalDNS taken twice {:?} apart",
                                    self.now - last
                                ));
                            }
                        }
                        self.throttled_takes.push(self.now);
                    }
                    self.target = Holder::Standby;
                    self.stale = None;
                    self.last_take = Some(why);
                    self.taken_at = Some(self.now);
                    self.takes += 1;
                }
                Out::HandBack => {
                    if self.target != Holder::Standby {
                        return Err("handed back flows it did not hold".into());
                    }
                    if self.answered_in_row < 2 {
                        return Err(format!(
                            "handed back after {} answered rounds",
                            self.answered_in_row
                        ));
                    }
                    if self.last_take == Some(Why::Unread) {
                        self.rest_until = Some(self.now + UNREAD_REST);
                    }
                    self.target = Holder::LocalDns;
                    self.stale = None;
                }
                Out::Repoint => self.stale = None,
                Out::CheckOwners => {
                    // A process waiting for a CPU is runnable; one reading may be caught asleep
                    // between datagrams; a hung one is stopped (SIGSTOP) or asleep (blocked), a
                    // starting one asleep. A shell that cannot see LocalDNS's cgroup (`blind`)
                    // says asleep.
                    let owners = match self.phase {
                        _ if self.blind => Owners::Asleep,
                        Phase::Throttled { .. } => Owners::Runnable,
                        Phase::Serving | Phase::Mute if self.rng.random_bool(0.5) => {
                            Owners::Runnable
                        }
                        Phase::Hung if self.stopped => Owners::Stopped,
                        _ => Owners::Asleep,
                    };
                    self.flows.owners(self.now, owners);
                }
                Out::Ask => {
                    // Lost replies come alone: two in a row is a silent LocalDNS.
                    let lost = !self.last_lost && self.rng.random_bool(0.05);
                    self.last_lost = lost;
                    if lost {
                        self.lost_at = Some(self.now);
                    }
                    self.probe = Some(Probe {
                        asked: self.now,
                        lost,
                    });
                }
                Out::Look { .. } => {
                    let reads = self.reads();
                    let now = self.now;
                    let mut view = Vec::new();
                    for s in &mut self.sockets {
                        let queued = if reads {
                            healthy_noise(&mut self.rng, now, s)
                        } else {
                            s.unread
                        };
                        view.push(Queue {
                            inode: s.inode,
                            queued,
                        });
                    }
                    let complete = !self.sockets.is_empty();
                    if TRACE.with(|t| *t) {
                        eprintln!("{:?} look {view:?}", self.now - self.phase_since);
                    }
                    self.flows.looked(now, &view, complete);
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        // Nothing answers an address that is gone but our own on lo: taken at once.
        if !self.addresses && self.target == Holder::LocalDns {
            return Err("LocalDNS's addresses are gone and its flows not taken".into());
        }
        if let (Holder::Standby, Some(since)) = (self.target, self.serving_since) {
            let since = [self.lost_at, self.taken_at]
                .into_iter()
                .flatten()
                .fold(since, Instant::max);
            if self.now - since > HAND_BACK_BOUND {
                return Err(format!(
                    "LocalDNS serves since {:?} ago and the standby still holds its flows",
                    self.now - since
                ));
            }
        }
        if let Some(stale) = self.stale {
            let bound = match self.target {
                Holder::Standby => PROBE_EVERY,
                Holder::LocalDns => LOOK_EVERY,
            } + MS;
            if self.now - stale > bound {
                return Err(format!(
                    "steering stale for {:?} with {:?} holding",
                    self.now - stale,
                    self.target
                ));
            }
        }
        Ok(())
    }

    /// A new flow: which socket it reaches, and whether that one serves it in time.
    fn query(&mut self) -> Result<(), String> {
        let to_localdns = match (self.target, self.stale.is_some()) {
            (Holder::Standby, false) | (Holder::LocalDns, true) => false,
            (Holder::Standby, true) | (Holder::LocalDns, false) => !self.sockets.is_empty(),
        };
        if !to_localdns {
            return Ok(());
        }
        let i = self.rng.random_range(0..self.sockets.len());
        if !self.reads() {
            self.sockets[i].unread += 100;
            self.first_unread.get_or_insert(self.now);
        }
        if self.answers_now() || matches!(self.phase, Phase::Throttled { .. }) {
            return Ok(());
        }
        let since = self.not_serving_since.unwrap_or(self.now);
        let resting = self.rest_until.is_some_and(|r| self.now < r);
        let (bound, from) = match self.first_unread {
            // A stall that began during a rest is timed from its end.
            Some(first) if !resting && self.addresses => {
                (QUEUE_BOUND, self.rest_until.map_or(first, |r| r.max(first)))
            }
            _ => (PROBE_BOUND, since),
        };
        if self.now - from > bound {
            return Err(format!(
                "a flow went to LocalDNS ({:?}) {:?} after it stopped serving (bound {bound:?})",
                self.phase,
                self.now - from
            ));
        }
        Ok(())
    }

    fn probe_event(&self) -> Option<Instant> {
        self.probe.as_ref().map(|p| {
            if self.now < p.asked + MS {
                p.asked + MS
            } else {
                p.asked + WAIT
            }
        })
    }

    fn settle_probe(&mut self) {
        let Some(p) = &self.probe else { return };
        let refused = self.sockets.is_empty() || !self.addresses;
        let answered = !p.lost && self.now >= p.asked + MS && self.answers_now();
        if refused || answered || self.now >= p.asked + WAIT {
            self.probe = None;
            self.answered_in_row = if answered {
                self.answered_in_row + 1
            } else {
                0
            };
            self.flows.asked(self.now, answered);
        }
    }

    /// The next thing that happens to LocalDNS.
    fn change(&mut self) {
        let r: f64 = self.rng.random();
        let d =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..hi));
        match self.phase {
            Phase::Serving if r < 0.2 => {
                self.stopped = self.rng.random_bool(0.5);
                self.set_phase(Phase::Hung)
            }
            Phase::Serving if r < 0.32 => {
                self.close_sockets(0);
                if self.rng.random_bool(0.5) {
                    self.addresses = false;
                    self.flows.addresses_gone();
                }
                self.set_phase(Phase::Absent);
            }
            Phase::Serving if r < 0.42 => {
                // A quick restart: new sockets at once.
                let n = self.sockets.len().max(1);
                self.close_sockets(0);
                for _ in 0..n {
                    self.new_socket();
                }
                self.observe();
            }
            Phase::Serving if r < 0.47 => self.set_phase(Phase::Mute),
            Phase::Serving if r < 0.55 => {
                let frozen = d(&mut self.rng, 10, 80);
                self.set_phase(Phase::Throttled { frozen });
                self.next_change = self.now + d(&mut self.rng, 2000, 25000);
                return;
            }
            Phase::Serving if r < 0.65 => {
                if self.sockets.len() > 1 && self.rng.random_bool(0.5) {
                    let keep = self.sockets.len() - 1;
                    self.close_sockets(keep);
                } else {
                    self.new_socket();
                }
                self.observe();
            }
            Phase::Serving if r < 0.7 => {
                // The standby itself restarts: a new process asks before it binds.
                let serves = self.answers_now();
                self.flows = Flows::new(self.now, serves);
                self.target = if serves {
                    Holder::LocalDns
                } else {
                    Holder::Standby
                };
                self.stale = None;
                self.probe = None;
                self.answered_in_row = 0;
                self.rest_until = None;
                self.last_take = None;
                self.throttled_takes.clear();
            }
            Phase::Serving => {
                self.query_every = (!self.rng.random_bool(0.2))
                    .then(|| Duration::from_micros(self.rng.random_range(1000..20000)));
            }
            Phase::Absent => {
                // LocalDNS's script recreates its link, then CoreDNS binds; slow start-ups too.
                self.addresses = true;
                let n = self.rng.random_range(1..=4);
                for _ in 0..n {
                    self.new_socket();
                }
                let slow = if self.rng.random_bool(0.2) { 2000 } else { 20 };
                let reads_at = self.now + d(&mut self.rng, 0, slow);
                self.set_phase(Phase::Starting { reads_at });
            }
            Phase::Hung | Phase::Mute | Phase::Throttled { .. } | Phase::Starting { .. } => {
                self.set_phase(Phase::Serving)
            }
        }
        let (lo, hi) = match self.phase {
            Phase::Serving => (50, 3000),
            Phase::Hung => (10, 3000),
            Phase::Absent => (0, 3000),
            _ => (200, 2000),
        };
        self.next_change = self.now + d(&mut self.rng, lo, hi);
    }
}

/// What a healthy socket's queue reads: often empty, now and then a few datagrams, never
/// growing for longer than `HEALTHY_RUN`.
fn healthy_noise(rng: &mut StdRng, now: Instant, s: &mut Sock) -> u32 {
    let q = if rng.random_bool(0.7) {
        0
    } else {
        rng.random_range(1..3000)
    };
    let q = match s.run {
        Some((since, last)) if q >= last && now - since >= HEALTHY_RUN => 0,
        _ => q,
    };
    s.run = match s.run {
        _ if q == 0 => None,
        Some((since, last)) if q >= last => Some((since, q)),
        _ => Some((now, q)),
    };
    q
}

thread_local!(static TRACE: bool = std::env::var_os("FLOWS_TRACE").is_some());

const LIFETIME: Duration = Duration::from_secs(20);

fn lifecycle(seed: u64) -> Result<u32, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let serving_at_start = rng.random_bool(0.7);
    let mut w = World {
        now: start,
        flows: Flows::new(start, serving_at_start),
        phase: if serving_at_start {
            Phase::Serving
        } else {
            Phase::Absent
        },
        phase_since: start,
        sockets: Vec::new(),
        next_inode: 0,
        addresses: true,
        target: if serving_at_start {
            Holder::LocalDns
        } else {
            Holder::Standby
        },
        stale: None,
        probe: None,
        last_lost: false,
        answered_in_row: 0,
        lost_at: None,
        not_serving_since: None,
        first_unread: None,
        healthy_since: None,
        serving_since: None,
        rest_until: None,
        last_take: None,
        taken_at: None,
        throttled_takes: Vec::new(),
        query_every: Some(Duration::from_millis(rng.random_range(1..20))),
        next_query: start,
        next_change: start + Duration::from_millis(rng.random_range(50..3000)),
        takes: 0,
        blind: rng.random_bool(0.3),
        stopped: false,
        rng,
    };
    if serving_at_start {
        let n = w.rng.random_range(1..=4);
        for _ in 0..n {
            w.new_socket();
        }
    }
    w.observe();
    let end = start + LIFETIME;
    while w.now < end {
        w.carry_out()?;
        w.check()?;
        let mut next = w.flows.deadline().min(w.next_change).min(end);
        if w.query_every.is_some() {
            next = next.min(w.next_query);
        }
        for at in [w.probe_event(), w.phase_event()].into_iter().flatten() {
            next = next.min(at);
        }
        if next <= w.now {
            next = w.now + Duration::from_micros(100);
        }
        w.now = next;
        w.observe();
        w.settle_probe();
        if let Some(every) = w.query_every {
            if w.now >= w.next_query {
                w.next_query = w.now + every;
                w.query()?;
            }
        }
        if w.now >= w.next_change {
            w.change();
        }
    }
    Ok(w.takes)
}

#[test]
fn seeded_lifecycles_keep_flows_on_a_responder_that_serves() {
    let seeds: Vec<u64> = match std::env::var("FLOWS_SEED") {
        Ok(s) => vec![s.parse().expect("FLOWS_SEED is a number")],
        Err(_) => {
            let n =
                std::env::var("FLOWS_LIFECYCLES").map_or(1000, |n| n.parse().expect("a number"));
            (0..n).collect()
        }
    };
    let mut takes = 0;
    let failed: Vec<String> = seeds
        .iter()
        .filter_map(|&seed| match lifecycle(seed) {
            Ok(t) => {
                takes += t;
                None
            }
            Err(e) => Some(format!("seed {seed}: {e} (replay: FLOWS_SEED={seed})")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} lifecycles failed; first: {}",
        failed.len(),
        seeds.len(),
        failed.first().map_or("", |s| s.as_str())
    );
    // Liveness has to have been exercised, not only safety.
    assert!(takes as usize > seeds.len(), "only {takes} takes");
}

/// Drives `f` from `start` as the shell would, each look seeing one socket with `queued(look)`
/// queued and each owners check answered with `owners(check)`, each wake `late` past its
/// deadline; returns how long after `start` the flows were taken, if within `until`.
fn drive(
    f: &mut Flows,
    start: Instant,
    until: Duration,
    late: Duration,
    mut queued: impl FnMut(u32) -> u32,
    owners: impl Fn(usize) -> Owners,
) -> Option<Duration> {
    let (mut t, mut looks, mut checks) = (start, 0, 0);
    while t - start <= until {
        while let Some(o) = f.poll(t) {
            match o {
                Out::Look { .. } => {
                    let q = [Queue {
                        inode: 7,
                        queued: queued(looks),
                    }];
                    looks += 1;
                    f.looked(t, &q, true);
                }
                Out::CheckOwners => {
                    f.owners(t, owners(checks));
                    checks += 1;
                }
                Out::Take(_) => return Some(t - start),
                _ => {}
            }
        }
        t = f.deadline() + late;
    }
    None
}

#[test]
fn a_socket_left_unread_is_taken_from_within_the_bound_and_a_draining_one_never() {
    let t0 = Instant::now();
    let long = Duration::from_secs(5);
    // Draining: grows for two looks, then shrinks; over and over.
    let saw = |look: u32| [0, 100, 200, 50][look as usize % 4];
    let mut f = Flows::new(t0, true);
    let taken = drive(&mut f, t0, long, Duration::ZERO, saw, |_| Owners::Asleep);
    assert_eq!(taken, None);
    // Unread: it only grows. A runnable owner (throttled) has it timed afresh; an asleep one is
    // taken from after `UNREAD_FOR`, a stopped one at once. The first unread query waits at most
    // a look to be seen.
    let runnable_then_asleep = [
        Owners::Runnable,
        Owners::Runnable,
        Owners::Asleep,
        Owners::Asleep,
    ];
    for (answers, within) in [
        (
            runnable_then_asleep,
            LOOK_EVERY + 2 * UNREAD_FOR + 2 * STOPPED_FOR,
        ),
        (
            [Owners::Stopped; 4],
            LOOK_EVERY + STOPPED_FOR + 3 * LOOK_BUSY,
        ),
    ] {
        let mut f = Flows::new(t0, true);
        // Empty at the first look, unread from just after it.
        let grows = |look: u32| 100 * look;
        let owners = |n: usize| answers[n.min(3)];
        let taken = drive(&mut f, t0, long, Duration::ZERO, grows, owners);
        assert!(taken.is_some_and(|t| t <= within), "{answers:?}: {taken:?}");
    }
    // The standby paused as long as LocalDNS (every wake 29 ms late: a VM's CPUs stopped by
    // their host's quota): not taken by the queue, however long it lasts.
    let mut f = Flows::new(t0, true);
    let late = Duration::from_millis(29);
    let taken = drive(&mut f, t0, long, late, |_| 832, |_| Owners::Asleep);
    assert_eq!(taken, None, "a pause of the whole machine taken for a hang");
}

#[test]
fn a_pods_query_that_reaches_the_standby_aside_brings_a_look_at_once_but_one_per_gap() {
    let t0 = Instant::now();
    let mut f = Flows::new(t0, true);
    let q = [Queue {
        inode: 7,
        queued: 0,
    }];
    while let Some(o) = f.poll(t0) {
        if let Out::Look { .. } = o {
            f.looked(t0, &q, true);
        }
    }
    let t = t0 + STRAY_GAP;
    f.stray(t);
    assert_eq!(f.deadline(), t);
    assert!(matches!(f.poll(t), Some(Out::Look { .. })));
    f.looked(t, &q, true);
    f.stray(t + MS);
    assert!(f.deadline() >= t + STRAY_GAP, "{:?}", f.deadline() - t);
    // Not while the standby holds the flows: the query is ours to answer.
    let mut f = Flows::new(t0, false);
    while f.poll(t0).is_some() {}
    let next = f.deadline();
    f.stray(t0 + STRAY_GAP);
    assert_eq!(f.deadline(), next);
}
