//! systemd-resolved's upstream resolv.conf through the VNet DNS parser: whatever the file says,
//! the result never names a loopback stub or one of our own listeners (that would loop), and
//! never lists a server twice.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use localdns_fallback::discover::resolv_conf;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ours: [IpAddr; 2] = [[169, 254, 10, 10].into(), [169, 254, 10, 11].into()];
    let servers = resolv_conf::parse(&text, &ours);
    for (i, s) in servers.iter().enumerate() {
        assert!(!s.ip().is_loopback() && !s.ip().is_unspecified(), "{s}");
        assert!(!ours.contains(&s.ip()), "{s} is our own listener");
        assert_eq!(s.port(), 53);
        assert!(!servers[..i].contains(s), "{s} listed twice");
    }
});
