//! The query sets. Every name is under `load.test.`, which the synthetic upstream (and the knot
//! zone, through a wildcard) answers.
//!
//! - `miss`: a name never asked before in this run — `<run prefix><counter>.load.test.` — so no
//!   cache can answer it.
//! - `hit`: one of [`HIT_NAMES`] names, `h0.load.test.` .. `h99.load.test.`, asked in turn: after the
//!   first round a cache answers all of them.
//! - `mix`: each query a hit name with probability `hit_percent`, otherwise a miss name.
//!
//! A name is identified by a `key` (hit names: `HIT_FLAG | n`; miss names: the counter) so the
//! tracker can keep 8 bytes per query and rebuild the name to check the reply's question.

use std::fmt::Write as _;

/// How many names the cache-hit set has.
pub const HIT_NAMES: u64 = 100;
/// Marks a key as a hit name.
const HIT_FLAG: u64 = 1 << 63;
/// The zone every query is under.
pub const ZONE: &str = "load.test";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameSet {
    Miss,
    Hit,
    /// A hit name with this probability in percent.
    Mix(u8),
}

impl NameSet {
    pub fn parse(s: &str) -> Result<NameSet, String> {
        match s {
            "miss" => Ok(NameSet::Miss),
            "hit" => Ok(NameSet::Hit),
            "mix" => Ok(NameSet::Mix(50)),
            _ => match s.strip_prefix("mix") {
                Some(p) => match p.parse::<u8>() {
                    Ok(p) if p <= 100 => Ok(NameSet::Mix(p)),
                    _ => Err(format!("bad name set {s:?}: mixNN needs NN in 0..=100")),
                },
                None => Err(format!(
                    "bad name set {s:?}: use miss, hit, mix or mixNN (NN% hits)"
                )),
            },
        }
    }
}

/// Hands out names of one set, in order.
pub struct Names {
    set: NameSet,
    /// A per-run prefix (base 36): two runs never share a miss name.
    prefix: String,
    next_miss: u64,
    next_hit: u64,
    rng: u64,
}

impl Names {
    /// `seed` picks the run prefix and the mix's coin flips.
    pub fn new(set: NameSet, seed: u64) -> Names {
        let mut prefix = String::from("m");
        let mut s = seed;
        for _ in 0..5 {
            prefix.push(char::from_digit((s % 36) as u32, 36).unwrap_or('0'));
            s /= 36;
        }
        Names {
            set,
            prefix,
            next_miss: 0,
            next_hit: seed % HIT_NAMES,
            rng: seed | 1,
        }
    }

    /// The key of the next name to ask.
    pub fn next_key(&mut self) -> u64 {
        let hit = match self.set {
            NameSet::Miss => false,
            NameSet::Hit => true,
            NameSet::Mix(p) => {
                // xorshift64: cheap and good enough for a coin.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                self.rng % 100 < u64::from(p)
            }
        };
        if hit {
            let k = HIT_FLAG | self.next_hit;
            self.next_hit = (self.next_hit + 1) % HIT_NAMES;
            k
        } else {
            let k = self.next_miss;
            self.next_miss += 1;
            k
        }
    }

    /// Writes the wire-format name of `key` into `out` (at least 64 bytes); returns its length.
    pub fn write_wire(&self, key: u64, out: &mut [u8]) -> usize {
        let mut label = [0u8; 32];
        let n = if key & HIT_FLAG != 0 {
            label[0] = b'h';
            1 + write_decimal(key & !HIT_FLAG, &mut label[1..])
        } else {
            let p = self.prefix.as_bytes();
            label[..p.len()].copy_from_slice(p);
            p.len() + write_base36(key, &mut label[p.len()..])
        };
        out[0] = n as u8;
        out[1..1 + n].copy_from_slice(&label[..n]);
        let tail = b"\x04load\x04test\x00";
        out[1 + n..1 + n + tail.len()].copy_from_slice(tail);
        1 + n + tail.len()
    }

    /// The name of `key` as text (for dnsperf's query file).
    pub fn text(&self, key: u64) -> String {
        let mut wire = [0u8; 64];
        let len = self.write_wire(key, &mut wire);
        let mut s = String::with_capacity(len);
        let mut i = 0;
        while wire[i] != 0 {
            let l = wire[i] as usize;
            let _ = write!(s, "{}.", String::from_utf8_lossy(&wire[i + 1..i + 1 + l]));
            i += 1 + l;
        }
        s
    }
}

fn write_decimal(mut v: u64, out: &mut [u8]) -> usize {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = tmp[n - 1 - i];
    }
    n
}

fn write_base36(mut v: u64, out: &mut [u8]) -> usize {
    let mut tmp = [0u8; 16];
    let mut n = 0;
    loop {
        let d = (v % 36) as u8;
        tmp[n] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
        n += 1;
        v /= 36;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = tmp[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miss_names_are_unique_and_hit_names_cycle() {
        let mut n = Names::new(NameSet::Miss, 42);
        let a = n.next_key();
        let b = n.next_key();
        assert_ne!(n.text(a), n.text(b));
        assert!(n.text(a).ends_with(".load.test."));
        let mut h = Names::new(NameSet::Hit, 0);
        let first: Vec<String> = (0..HIT_NAMES)
            .map(|_| {
                let k = h.next_key();
                h.text(k)
            })
            .collect();
        assert_eq!(first[0], "h0.load.test.");
        let k = h.next_key();
        assert_eq!(h.text(k), first[0]);
        let mut wire = [0u8; 64];
        let len = h.write_wire(k, &mut wire);
        assert_eq!(
            &wire[..len],
            &crate::dns::encode_name("h0.load.test").unwrap()[..]
        );
    }

    #[test]
    fn mix_is_roughly_its_percentage() {
        let mut n = Names::new(NameSet::Mix(30), 7);
        let hits = (0..10_000).filter(|_| n.next_key() & HIT_FLAG != 0).count();
        assert!((2_500..3_500).contains(&hits), "{hits}");
    }
}
