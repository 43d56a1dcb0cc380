//! One history run: the world drawn from its seed, then its events one at a time, each kind in a
//! function of its own (what the engine sent, a timer, each kind of input), recorded in `History`
//! for `judge`.

use super::*;

/// A history under way: the engines, the inputs still to come, and the clock.
struct Run {
    rng: Mix,
    h: History,
    engines: Vec<Engine>,
    settings: Settings,
    t0: Instant,
    /// Inputs by (ms, order of scheduling); each parked until it is taken.
    inputs: BinaryHeap<(Reverse<u64>, Reverse<u64>, usize)>,
    parked: Vec<Option<Input>>,
    seq: u64,
    trace: bool,
    step: usize,
    now: u64,
    end: u64,
    /// A timer due at the first, to fire at the second (late on a busy thread).
    timer: Option<(u64, u64)>,
}

/// What `draw_world` makes: the history without clients, the discoveries to come, and the death
/// scenario's group (an outage too) and when its backends die.
struct World {
    h: History,
    discoveries: Vec<(u64, usize, Vec<usize>)>,
    death: Option<usize>,
    died_at: u64,
    small: bool,
    death_bursts: bool,
    seed2s: Vec<[u8; 32]>,
}

pub(super) fn run_history(seed: u64) -> Result<(), String> {
    let mut run = Run::new(seed);
    while run.step()? {}
    judge(&run.h)
}

/// Per group: the server sets in force, from when (ms).
type Sets = [Vec<(u64, Vec<usize>)>; 2];

fn draw_servers(
    rng: &mut Mix,
    death: Option<usize>,
    outage: bool,
    died_at: u64,
) -> (Vec<Server>, Sets) {
    let mut servers = Vec::new();
    let mut sets: Sets = [Vec::new(), Vec::new()];
    for (g, group_sets) in sets.iter_mut().enumerate() {
        let n = if death == Some(g) {
            2
        } else {
            rng.random_range(1..=3)
        };
        let mut set = Vec::new();
        for i in 0..n {
            let index = servers.len();
            let mut s = draw_server(rng, g, i as u8 + 1, index, death == Some(g));
            if death == Some(g) && (i == 1 || outage) {
                s.dies = Some(died_at);
            }
            servers.push(s);
            set.push(index);
        }
        group_sets.push((0, set));
    }
    (servers, sets)
}

/// Discovery replaces a group's servers: one goes (it still answers whoever asks it), a new one
/// comes.
fn draw_discoveries(
    rng: &mut Mix,
    death: Option<usize>,
    servers: &mut Vec<Server>,
    sets: &mut Sets,
) -> Vec<(u64, usize, Vec<usize>)> {
    let mut discoveries = Vec::new();
    for (g, group_sets) in sets.iter_mut().enumerate() {
        if death != Some(g) && rng.random_bool(0.2) {
            let at = rng.random_range(1_000..30_000);
            let mut set = group_sets[0].1.clone();
            if set.len() > 1 {
                set.remove(rng.random_range(0..set.len()));
            }
            let index = servers.len();
            servers.push(draw_server(rng, g, 10, index, false));
            set.push(index);
            group_sets.push((at, set.clone()));
            discoveries.push((at, g, set));
        }
    }
    discoveries
}

fn draw_ttls(rng: &mut Mix) -> [[(u32, u32); NAMES]; 2] {
    let ttl_choices = [0, 1, 3, 7, 20];
    std::array::from_fn(|_| {
        std::array::from_fn(|_| {
            let t = ttl_choices[rng.random_range(0..ttl_choices.len())];
            let m = if rng.random_bool(0.3) {
                ttl_choices[rng.random_range(0..ttl_choices.len())]
            } else {
                t
            };
            (t, m)
        })
    })
}

/// The first listener's engine as the history's world asks: its servers, routes, cap and cache.
fn engine_setup(
    seed: u64,
    role: ListenerRole,
    servers: &[Server],
    sets: &Sets,
    routing: &Routing,
    max_inflight: usize,
    cache: bool,
) -> Setup {
    let addrs =
        |g: usize| -> Vec<SocketAddr> { sets[g][0].1.iter().map(|i| servers[*i].addr).collect() };
    let mut setup = Setup::new(role, addrs(0), addrs(1));
    setup.settings.max_inflight = max_inflight;
    setup.routes = routing.routes();
    setup.seed = std::array::from_fn(|i| (seed >> (8 * (i % 8))) as u8 ^ i as u8);
    setup.cache = cache.then(|| Limits {
        min_ttl: Duration::from_millis(MIN_TTL_MS),
        max_stale: Duration::from_millis(MAX_STALE_MS),
        ..Limits::default()
    });
    setup
}

/// The world of one history: listeners, servers and their sets, names' TTLs, the engine's
/// settings and the seeds of its listeners.
fn draw_world(rng: &mut Mix, seed: u64) -> (World, Setup) {
    let cluster_only = rng.random_bool(0.2);
    let roles = if cluster_only {
        vec![ListenerRole::Cluster]
    } else if rng.random_bool(0.5) {
        vec![ListenerRole::Node, ListenerRole::Cluster]
    } else {
        vec![ListenerRole::Node]
    };
    let small = rng.random_bool(0.12);
    let death = (!small && rng.random_bool(0.25)).then(|| {
        if cluster_only {
            1
        } else {
            rng.random_range(0..2)
        }
    });
    // Sometimes both die at once: a full outage, under bursts of new names.
    let outage = death.is_some() && rng.random_bool(0.05);
    let died_at = rng.random_range(2_000..20_000);
    // The death scenarios pick names that reach the dying group through the default routes.
    let routing = if death.is_none() {
        Routing::draw(rng)
    } else {
        Routing::default()
    };
    let hosts = if death.is_none() {
        draw_hosts(rng)
    } else {
        Vec::new()
    };
    let (mut servers, mut sets) = draw_servers(rng, death, outage, died_at);
    let discoveries = draw_discoveries(rng, death, &mut servers, &mut sets);
    let ttls = draw_ttls(rng);
    let transport = if rng.random_bool(0.7) {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    // Through a backend's death, sometimes bursts of new names: half of each burst goes to the
    // dead one until it is known dead, more hedges than the budget holds (the cache off, so that
    // every query goes upstream).
    let death_bursts = death.is_some() && (outage || rng.random_bool(0.05));
    let cache = !death_bursts && rng.random_bool(0.9);
    let max_inflight = if small {
        rng.random_range(4..=12)
    } else {
        Settings::default().max_inflight
    };
    let late_timers = rng.random_bool(0.5);

    let setup = engine_setup(
        seed,
        roles[0],
        &servers,
        &sets,
        &routing,
        max_inflight,
        cache,
    );
    let budget = setup.settings.query_timeout.as_millis() as u64;
    let try_time = setup.settings.upstream_timeout.as_millis() as u64;
    let seed2s = (1..roles.len())
        .map(|i| {
            let mut seed2 = [0u8; 32];
            rng.fill_bytes(&mut seed2);
            seed2[0] ^= i as u8;
            seed2
        })
        .collect();
    let h = History {
        servers,
        sets,
        ttls,
        roles,
        routing,
        hosts,
        transport,
        cache,
        max_inflight,
        late_timers,
        death: death.filter(|_| !outage),
        outage: outage.then_some(died_at),
        timer_steps: Vec::new(),
        budget,
        try_time,
        clients: Vec::new(),
        sent: Vec::new(),
        heard: Vec::new(),
        refusals: Vec::new(),
    };
    let w = World {
        h,
        discoveries,
        death,
        died_at,
        small,
        death_bursts,
        seed2s,
    };
    (w, setup)
}

/// The clients' queries: gaps from none (bursts) to seconds; through a death, names of the
/// dying group, and its bursts. Returns the last query's ms.
fn draw_clients(rng: &mut Mix, w: &mut World, engines: usize) -> u64 {
    let (h, death) = (&mut w.h, w.death);
    let mut t = 0;
    let count = rng.random_range(15..60);
    let bursty = w.small || rng.random_bool(0.15);
    for i in 0..count {
        t += match rng.random_range(0..10) {
            _ if bursty && rng.random_bool(0.5) => 0,
            0..5 => rng.random_range(0..20),
            5..8 => rng.random_range(20..1000),
            _ => rng.random_range(1000..=3000),
        };
        // The death scenario warms both servers up first, so their round trips are known.
        if death.is_some() && i < 6 {
            t = i as u64 * 150;
        }
        let mut engine = rng.random_range(0..engines);
        let mut nid = rng.random_range(0..NAMES);
        if let Some(g) = death.filter(|_| rng.random_bool(0.6) || i < 6) {
            // Only the node listener (the first) sends anything to the VNet DNS.
            if g == UpstreamGroup::VnetDns as usize {
                engine = 0;
            }
            while h.routing.group_of(h.roles[engine], nid) != g {
                nid = rng.random_range(0..NAMES);
            }
        }
        let client = new_client(rng, h, i, engine, nid, t);
        h.clients.push(client);
    }
    if let (Some(g), true) = (death, w.death_bursts) {
        let died = w.died_at;
        let n = h.clients.len();
        for b in 0..16 * 20 {
            let i = n + b;
            let engine = if g == UpstreamGroup::VnetDns as usize {
                0
            } else {
                rng.random_range(0..engines)
            };
            let mut nid = rng.random_range(0..NAMES);
            while h.routing.group_of(h.roles[engine], nid) != g {
                nid = rng.random_range(0..NAMES);
            }
            let at = died + 20 + (b / 20) as u64 * 50;
            t = t.max(at);
            let client = new_client(rng, h, i, engine, nid, at);
            h.clients.push(client);
        }
    }
    // A query answered from the hosts file may ask AAAA or any other type (NODATA).
    for i in 0..h.clients.len() {
        if h.hosts_answer(&h.clients[i]).is_some() && rng.random_bool(0.4) {
            let c = &mut h.clients[i];
            let at = wire::parse_query(&c.query).expect("ours").name_end;
            let qtype: u16 = [28, 15][rng.random_range(0..2)];
            c.query[at..at + 2].copy_from_slice(&qtype.to_be_bytes());
        }
    }
    t
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Mix(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995);
        let (mut w, setup) = draw_world(&mut rng, seed);
        let (settings, routes) = (setup.settings.clone(), setup.routes.clone());
        let t0 = Instant::now();
        let first = setup.start(t0).engine;
        let mut engines = vec![first];
        for (i, role) in w.h.roles.iter().enumerate().skip(1) {
            let e = &engines[0];
            engines.push(Engine::new(
                *role,
                settings.clone(),
                routes.clone(),
                e.upstreams.clone(),
                e.cache.clone(),
                Arc::new(ListenerStats::default()),
                w.seed2s[i - 1],
            ));
        }
        let last = draw_clients(&mut rng, &mut w, engines.len());
        let mut run = Run {
            rng,
            engines,
            settings,
            t0,
            inputs: BinaryHeap::new(),
            parked: Vec::new(),
            seq: 0,
            trace: std::env::var("HISTORY_TRACE").is_ok(),
            step: 0,
            now: 0,
            end: last + 20_000,
            timer: None,
            h: w.h,
        };
        // At the same ms, discovery and the hosts file first: the model's sets change at their
        // ms.
        for v in 0..run.h.hosts.len() {
            run.push(run.h.hosts[v].0, Input::Hosts(v));
        }
        for (ms, group, set) in w.discoveries {
            run.push(ms, Input::Discovery { group, set });
        }
        for i in 0..run.h.clients.len() {
            run.push(run.h.clients[i].at, Input::Query(i));
        }
        run
    }

    fn push(&mut self, ms: u64, input: Input) {
        self.parked.push(Some(input));
        self.seq += 1;
        self.inputs
            .push((Reverse(ms), Reverse(self.seq), self.parked.len() - 1));
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// What the engines sent since the last step, then the next timer or input. False at the end.
    fn step(&mut self) -> Result<bool, String> {
        let mut out = Vec::new();
        for (e, engine) in self.engines.iter_mut().enumerate() {
            while let Some(t) = engine.poll_transmit() {
                out.push((e, t.dest, t.bytes.to_vec()));
            }
            while engine.poll_event().is_some() {}
        }
        for (e, dest, bytes) in out {
            match dest {
                Dest::Client(c) => self.client_reply(e, c, bytes)?,
                Dest::Upstream(leg) => self.upstream(e, leg, &bytes)?,
            }
        }
        let next_input = self.inputs.peek().map(|(Reverse(ms), ..)| *ms);
        let due = self.timer_due();
        // Discovery and the hosts file change at their ms, before a timer due then: the model
        // takes them in force from that ms.
        let node_state = self.inputs.peek().is_some_and(|&(.., k)| {
            matches!(
                self.parked[k],
                Some(Input::Discovery { .. } | Input::Hosts(_))
            )
        });
        let timer_first = match (due, next_input) {
            (Some(t), Some(i)) => t < i || (t == i && !node_state),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return Ok(false),
        };
        self.step += 1;
        self.h.timer_steps.push(timer_first);
        if self.step > 100_000 {
            return Err(format!(
                "runaway at {} ms: timer {due:?}, input {next_input:?}",
                self.now
            ));
        }
        if timer_first {
            self.fire_timers(due.expect("checked"))?;
        } else {
            let (_, _, index) = self.inputs.pop().expect("checked");
            self.now = next_input.expect("checked");
            self.take_input(index);
        }
        Ok(true)
    }

    /// When the engines' next timer fires: when due, or late by up to `MAX_LATE`.
    fn timer_due(&mut self) -> Option<u64> {
        let t0 = self.t0;
        let next_timer = (self.engines.iter())
            .filter_map(|e| e.poll_timeout())
            .min()
            .map(|t| t.saturating_duration_since(t0).as_micros().div_ceil(1000) as u64);
        next_timer.map(|t| match self.timer {
            Some((was, fires)) if was == t => fires,
            _ => {
                let late = if self.h.late_timers {
                    self.rng.random_range(0..=MAX_LATE)
                } else {
                    0
                };
                self.timer = Some((t, t + late));
                t + late
            }
        })
    }

    fn fire_timers(&mut self, due: u64) -> Result<(), String> {
        self.now = due.max(self.now);
        if self.now > self.end {
            return Err(format!("timers still running at {} ms", self.now));
        }
        let at = self.at(self.now);
        for e in self.engines.iter_mut() {
            e.handle_timeout(at);
        }
        Ok(())
    }

    fn take_input(&mut self, index: usize) {
        match self.parked[index].take().expect("each input once") {
            Input::Query(i) => self.query(i),
            Input::Reply {
                engine,
                leg,
                from,
                bytes,
                valid,
            } => self.reply(engine, leg, from, &bytes, valid),
            Input::Failure {
                engine,
                leg,
                failure,
                sent,
            } => self.failure(engine, leg, failure, sent),
            Input::Unreachable { engine, server } => self.unreachable(engine, server),
            Input::Discovery { group, set } => self.discovery(group, &set),
            Input::Hosts(v) => self.hosts(v),
        }
    }

    fn client_reply(&mut self, e: usize, c: Client, bytes: Vec<u8>) -> Result<(), String> {
        let (now, step) = (self.now, self.step);
        let i = (self.h.clients.iter())
            .position(|a| a.client == c && a.engine == e)
            .ok_or_else(|| format!("a reply to {c:?}, who never asked"))?;
        if self.trace {
            note(format!(
                "{now:>6} [{step}] q{i} <- rcode {} {:?}",
                wire::rcode(&bytes),
                mark(&bytes)
            ));
        }
        self.h.clients[i].got.push((now, step, bytes));
        Ok(())
    }

    /// A try the engine sent: recorded, checked against the set in force, and given its fate.
    fn upstream(&mut self, e: usize, leg: Leg, bytes: &[u8]) -> Result<(), String> {
        let (now, step, h) = (self.now, self.step, &mut self.h);
        let q = wire::parse_query(bytes).map_err(|e| format!("a bad query upstream: {e:?}"))?;
        let nid = nid_of(bytes, &q).ok_or("a try for a name nobody asked")?;
        let group = h.routing.group_of(h.roles[e], nid);
        let key = MKey {
            group,
            nid,
            flags: flags_of(bytes, &q),
        };
        let server = (h.servers.iter())
            .position(|s| s.addr == leg.to)
            .ok_or_else(|| format!("a try to {}, no server", leg.to))?;
        // A truncated answer is fetched again over TCP from the same server, even one discovery
        // has just removed: the try named it.
        let refetch = leg.via == Via::Tcp
            && h.heard.last().is_some_and(|r| {
                let s = &h.sent[r.sent];
                r.step == step && r.truncated && s.server == server && s.key == key
            });
        if !refetch && !h.set_at(group, now).contains(&server) {
            return Err(format!(
                "{now} ms: a try for {} to {}, not a server of its group now",
                name_of(nid),
                leg.to
            ));
        }
        if h.transport == Transport::Tcp && leg.via != Via::Tcp {
            return Err(format!(
                "{now} ms: a TCP client's query went upstream over UDP"
            ));
        }
        let si = h.sent.len();
        h.sent.push(Sent {
            engine: e,
            leg,
            key,
            server,
            at: now,
            step,
            answered: None,
            ended: None,
        });
        let fate = self.fate(e, leg, bytes, key, server, si);
        // An off-path spoofer sees the try go out, whatever becomes of it.
        if roll(&mut self.rng, self.h.servers[server].spoof) {
            self.spoof(e, leg, bytes, &q, key, server);
        }
        if self.trace {
            note(format!(
                "{now:>6} [{step}] try#{si} e{e} {} {:?} {} flags {} -> {fate}",
                leg.to,
                leg.via,
                name_of(nid),
                key.flags
            ));
        }
        Ok(())
    }

    /// What the network and the server make of try `si`: the inputs it brings, and its name.
    fn fate(
        &mut self,
        e: usize,
        leg: Leg,
        bytes: &[u8],
        key: MKey,
        server: usize,
        si: usize,
    ) -> &'static str {
        let (now, rng, h) = (self.now, &mut self.rng, &self.h);
        let s = &h.servers[server];
        let b = s.names[key.nid];
        let udp = matches!(leg.via, Via::Udp { .. });
        let network = |failure| Input::Failure {
            engine: e,
            leg,
            failure: Failure::Network(failure),
            sent: si,
        };
        let mut inputs = Vec::new();
        let fate = if within(&s.unreachable, now) {
            let input = if udp && rng.random_bool(0.5) {
                Input::Unreachable { engine: e, server }
            } else {
                network(std::io::ErrorKind::ConnectionRefused)
            };
            inputs.push((now + 1, input));
            "refused"
        } else if roll(rng, s.send_fail) {
            inputs.push((now, network(std::io::ErrorKind::NetworkUnreachable)));
            "send failed"
        } else if s.drops(now) || roll(rng, s.loss) {
            "lost"
        } else if !udp && roll(rng, s.tcp_break) {
            let reset = network(std::io::ErrorKind::ConnectionReset);
            inputs.push((now + b.delay / 2, reset));
            "broken"
        } else {
            let (reply, kind, tc, version, ttl) =
                upstream_reply(bytes, h, s, key, leg.via, now + b.delay);
            let valid = Some((si, kind, tc, version, ttl));
            let reply_at = |bytes| Input::Reply {
                engine: e,
                leg,
                from: leg.to,
                bytes,
                valid,
            };
            if roll(rng, s.dup) {
                let later = now + b.delay + rng.random_range(0..50);
                inputs.push((later, reply_at(reply.clone())));
            }
            inputs.push((now + b.delay, reply_at(reply)));
            "answered"
        };
        for (ms, input) in inputs {
            self.push(ms, input);
        }
        fate
    }

    /// An off-path spoofer's reply to the try: a wrong ID, source port or address, or the same
    /// ID and source with another question.
    fn spoof(
        &mut self,
        e: usize,
        leg: Leg,
        bytes: &[u8],
        q: &wire::Query,
        key: MKey,
        server: usize,
    ) {
        let (now, rng, h) = (self.now, &mut self.rng, &self.h);
        let s = &h.servers[server];
        let mut spoof = upstream_reply(bytes, h, s, key, leg.via, now).0;
        poison(&mut spoof);
        let mut from = leg.to;
        match rng.random_range(0..4) {
            0 => {
                let id = wire::id(&spoof) ^ rng.random_range(1..=u16::MAX);
                wire::set_id(&mut spoof, id);
            }
            1 => from.set_port(5353),
            2 => from = SocketAddr::from(([198, 18, key.group as u8, 99], 53)),
            _ => {
                let nid = key.nid;
                let other = (nid + 1) % PER_SUFFIX + nid / PER_SUFFIX * PER_SUFFIX;
                let mut q2 = query(wire::id(bytes), &name_of(other), q.edns.then_some(1232));
                q2[2] = bytes[2];
                let k2 = MKey { nid: other, ..key };
                spoof = upstream_reply(&q2, h, s, k2, leg.via, now).0;
                poison(&mut spoof);
            }
        }
        let at = now + rng.random_range(0..=1500);
        let input = Input::Reply {
            engine: e,
            leg,
            from,
            bytes: spoof,
            valid: None,
        };
        self.push(at, input);
    }

    fn query(&mut self, i: usize) {
        let (now, step, at) = (self.now, self.step, self.at(self.now));
        let c = &mut self.h.clients[i];
        c.step = step;
        if self.trace {
            note(format!(
                "{now:>6} [{step}] q{i} e{} asks {} flags {} (down: {:?})",
                c.engine,
                String::from_utf8_lossy(&c.query[13..c.query.len().min(40)]),
                c.key.flags,
                UpstreamGroup::BOTH.map(|g| self.engines[0]
                    .upstreams()
                    .get(g)
                    .down(at, self.settings.query_timeout))
            ));
        }
        self.engines[c.engine].handle_query(at, c.client, &c.query);
    }

    fn reply(
        &mut self,
        engine: usize,
        leg: Leg,
        from: SocketAddr,
        bytes: &[u8],
        valid: Option<(usize, Kind, bool, u8, u32)>,
    ) {
        let (now, step, h) = (self.now, self.step, &mut self.h);
        // A spoof whose made-up ID is that of another try at that server, for the same name, is
        // a lucky guess no check can tell from the answer: not sent.
        let lucky = valid.is_none()
            && wire::id(bytes) != leg.id
            && h.sent.iter().any(|s| {
                s.leg.to == from && s.leg.id == wire::id(bytes) && s.at + h.budget + 1000 > now
            });
        if lucky {
            return;
        }
        if let Some((si, kind, truncated, version, ttl)) = valid {
            let first = h.sent[si].answered.is_none();
            h.heard.push(Heard {
                first,
                sent: si,
                at: now,
                step,
                kind,
                truncated,
                version,
                ttl,
            });
            h.sent[si].answered.get_or_insert(now);
        }
        if self.trace {
            note(format!(
                "{now:>6} [{step}] reply from {from} id {} {}",
                wire::id(bytes),
                match valid {
                    Some(v) => format!("valid for try#{}", v.0),
                    None => "SPOOFED".to_string(),
                }
            ));
        }
        let at = self.at(now);
        self.engines[engine].handle_reply(at, leg.via, from, bytes);
    }

    fn failure(&mut self, engine: usize, leg: Leg, failure: Failure, sent: usize) {
        let (now, step, h) = (self.now, self.step, &mut self.h);
        let server = h.sent[sent].server;
        let sent_at = h.sent[sent].at;
        let refused = failure == Failure::Network(std::io::ErrorKind::ConnectionRefused);
        // A UDP try refused ends the engine's other UDP tries at that server, as an ICMP error.
        let sent_at = if matches!(leg.via, Via::Udp { .. }) && refused {
            end_udp_tries(h, engine, server, now);
            now
        } else {
            h.sent[sent].ended.get_or_insert(now);
            sent_at
        };
        h.refusals.push(Refusal {
            server,
            at: now,
            step,
            sent_at,
        });
        if self.trace {
            note(format!("{now:>6} [{step}] try#{sent} {failure:?}"));
        }
        let at = self.at(now);
        self.engines[engine].handle_failure(at, leg, failure);
    }

    fn unreachable(&mut self, engine: usize, server: usize) {
        let (now, step, h) = (self.now, self.step, &mut self.h);
        end_udp_tries(h, engine, server, now);
        h.refusals.push(Refusal {
            server,
            at: now,
            step,
            sent_at: now,
        });
        let addr = h.servers[server].addr;
        if self.trace {
            note(format!("{now:>6} [{step}] ICMP unreachable from {addr}"));
        }
        let at = self.at(now);
        self.engines[engine].handle_unreachable(at, addr);
    }

    fn discovery(&mut self, group: usize, set: &[usize]) {
        let (now, step) = (self.now, self.step);
        let old = self.engines[0].upstreams().clone();
        let addrs = set.iter().map(|i| self.h.servers[*i].addr).collect();
        // As the daemon's discovery makes it: a new set, born now.
        let fresh = Arc::new(UpstreamSet::new(addrs, self.at(now)));
        let sets = Arc::new(if group == UpstreamGroup::VnetDns as usize {
            UpstreamSets {
                vnet_dns: fresh,
                kube_dns: old.kube_dns.clone(),
                hosts: old.hosts.clone(),
            }
        } else {
            UpstreamSets {
                vnet_dns: old.vnet_dns.clone(),
                kube_dns: fresh,
                hosts: old.hosts.clone(),
            }
        });
        if self.trace {
            note(format!(
                "{now:>6} [{step}] discovery: group {group} is now {set:?}"
            ));
        }
        for e in self.engines.iter_mut() {
            e.set_upstreams(sets.clone());
        }
    }

    fn hosts(&mut self, v: usize) {
        let (now, step) = (self.now, self.step);
        let old = self.engines[0].upstreams().clone();
        let text = hosts_text(&self.h.hosts[v].1);
        if self.trace {
            note(format!("{now:>6} [{step}] hosts file:\n{text}"));
        }
        let sets = Arc::new(UpstreamSets {
            vnet_dns: old.vnet_dns.clone(),
            kube_dns: old.kube_dns.clone(),
            hosts: Arc::new(Hosts::parse(text.as_bytes())),
        });
        for e in self.engines.iter_mut() {
            e.set_upstreams(sets.clone());
        }
    }
}

/// A chance of `pct` percent.
fn roll(rng: &mut Mix, pct: u32) -> bool {
    pct > 0 && rng.random_range(0..100) < pct
}

fn note(line: String) {
    eprintln!("{line}");
}

/// An ICMP error for `server` ends every UDP try of that engine still out there, and every one
/// judged lost whose late reply would still have been taken.
fn end_udp_tries(h: &mut History, engine: usize, server: usize, now: u64) {
    for s in h.sent.iter_mut() {
        if s.engine == engine
            && s.server == server
            && matches!(s.leg.via, Via::Udp { .. })
            && s.answered.is_none()
            && s.at + h.budget >= now
        {
            s.ended.get_or_insert(now);
        }
    }
}
