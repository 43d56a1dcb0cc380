//! The answer cache fed upstream replies of any shape: it must never panic, never hold more
//! bytes or entries than its limits, and hand back exactly what was stored (TTLs aside).
#![no_main]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fuzz_support::{Input, NAMES, build_query, shape_reply};
use libfuzzer_sys::fuzz_target;
use localdns_fallback::cache::{Cache, Hit, Key, KeyHasher, Limits};
use localdns_fallback::roles::UpstreamGroup;
use localdns_fallback::wire;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let limits = Limits {
        entries: 1 + usize::from(input.u8() % 32),
        bytes: usize::from(input.u16()),
        min_ttl: Duration::from_secs(u64::from(input.u8() % 10)),
        max_ttl: Duration::from_secs(10 + u64::from(input.u16())),
        max_stale: Duration::from_secs(u64::from(input.u16())),
    };
    let Some(mut cache) = Cache::new(limits, KeyHasher::new(7)) else {
        return;
    };
    let t0 = Instant::now();
    let mut now_s = 0u64;
    // The last reply stored under each key, to compare what comes back with.
    let mut stored: HashMap<Key, Vec<u8>> = HashMap::new();
    let mut out = Vec::new();
    while !input.is_empty() {
        let op = input.u8();
        let name = NAMES[usize::from(input.u8()) % NAMES.len()];
        let qtype = [1, 28, 16][usize::from(input.u8() % 3)];
        let edns = (op & 0x10 != 0).then_some((1232, op & 0x20 != 0));
        let query = build_query(1, name, input.u32(), qtype, edns);
        let q = wire::parse_query(&query).expect("built queries parse");
        let group = if op & 0x40 == 0 {
            UpstreamGroup::VnetDns
        } else {
            UpstreamGroup::KubeDns
        };
        let Some(key) = Key::new(cache.hasher(), group, &query, &q) else {
            continue;
        };
        let now = t0 + Duration::from_secs(now_s);
        match op % 4 {
            0 => {
                let reply = shape_reply(&query, &mut input);
                if cache.put(key.clone(), &reply, now) {
                    stored.insert(key, reply);
                }
            }
            1 => {
                let reply = input.blob().to_vec();
                if cache.put(key.clone(), &reply, now) {
                    stored.insert(key, reply);
                }
            }
            2 => {
                // What a query asks (fresh or stale, one lookup), then what a failed query asks.
                for stale_only in [false, true] {
                    let hit = if stale_only {
                        cache.get_stale(&key, now, &mut out).then_some(false)
                    } else {
                        cache.get(&key, now, &mut out).map(|hit| hit == Hit::Fresh)
                    };
                    if let Some(fresh) = hit {
                        let original = stored.get(&key).expect("a hit for a key never stored");
                        // COOKIE and ECS options (and records after the OPT) are not stored.
                        assert!(out.len() <= original.len());
                        assert_eq!(out[..10], original[..10]);
                        check_ttls(&out, original, fresh);
                    }
                }
            }
            _ => now_s += u64::from(input.u16()),
        }
        assert!(
            cache.bytes() <= limits.bytes,
            "{} bytes cached, cap {}",
            cache.bytes(),
            limits.bytes
        );
        assert!(cache.len() <= limits.entries);
        assert_eq!(cache.is_empty(), cache.bytes() == 0);
    }
});

/// A fresh hit counts TTLs down but never to 0 for a record stored with a TTL above 0; a stale
/// hit says `STALE_TTL`.
fn check_ttls(out: &[u8], original: &[u8], fresh: bool) {
    let (Some(ours), Some(theirs)) = (wire::records(out), wire::records(original)) else {
        panic!("a hit that does not walk");
    };
    for (o, t) in ours.iter().zip(&theirs).filter(|(o, _)| o.rtype != 41) {
        if fresh {
            assert!(o.ttl <= t.ttl, "TTL {} above the stored {}", o.ttl, t.ttl);
            assert!(
                o.ttl > 0 || t.ttl == 0,
                "TTL 0 for a record stored with {}",
                t.ttl
            );
        } else {
            assert_eq!(o.ttl, localdns_fallback::cache::STALE_TTL);
        }
    }
}
