#!/usr/bin/env bash
# Regenerates the seed corpus under fuzz/corpus/ from real tools, so the fuzzers start from the
# shapes the forwarder really meets:
# - client queries as dig and kdig send them (UDP datagrams, TCP streams), captured by a small
#   socket inside a private network namespace;
# - replies from dnsmasq and unbound to the forwarder's own query shape, captured the same way;
# - kube-proxy's iptables rules as `iptables -S` prints them (loaded into the namespace's own nat
#   table), the nft/ipvs/Cilium fixtures of tests/fixtures/, and resolv.conf shapes.
# Needs root, python3, dig, kdig, dnsmasq, unbound, iptables. Every packet goes to an address of the
# namespace this script makes; the namespace and every process in it are removed at exit.
set -euo pipefail
cd "$(dirname "$0")"
[[ $(id -u) -eq 0 ]] || { echo "make-corpus.sh: needs root (network namespace)" >&2; exit 1; }
for tool in python3 dig kdig dnsmasq unbound iptables-restore ip; do
    command -v "$tool" >/dev/null || { echo "make-corpus.sh: $tool is missing" >&2; exit 1; }
done

ns="lffuzzcorpus$$"
tmp=$(mktemp -d)
cleanup() {
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns"
in_ns() { ip netns exec "$ns" "$@"; }
in_ns ip link set lo up
in_ns ip link add fz0 type veth peer name fz1
in_ns ip link set fz1 up
in_ns ip addr add 198.18.0.2/24 dev fz0      # capture socket
in_ns ip addr add 198.18.0.3/24 dev fz0      # dnsmasq
in_ns ip addr add 198.18.0.4/24 dev fz0      # unbound
in_ns ip addr add fd00:18::2/64 dev fz0 nodad
in_ns ip link set fz0 up

corpus=$PWD/corpus
# Everything but the kept crash inputs (regression-*) is regenerated.
[[ -d $corpus ]] && find "$corpus" -type f ! -name 'regression-*' -delete
mkdir -p "$corpus"/{client_query,tcp_stream,upstream_reply,cache,udp_relay,iptables,nftables,cilium,resolv_conf,ipvs}

# ---- client queries from dig and kdig --------------------------------------------------------
# The capture server answers every query with a bare REFUSED so the clients finish at once, and
# saves each UDP datagram and each TCP connection's whole byte stream.
in_ns python3 - "$tmp/cap" <<'EOF' &
import os, socket, sys, threading
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
n = [0]
def save(kind, data):
    n[0] += 1
    open(os.path.join(out, f"{kind}-{n[0]:03d}"), "wb").write(data)
def refused(q):
    return q[:2] + bytes([0x80 | (q[2] & 0x79), 0x85]) + bytes(8) if len(q) >= 12 else b""
def udp(fam, addr):
    s = socket.socket(fam, socket.SOCK_DGRAM); s.bind((addr, 53))
    while True:
        q, src = s.recvfrom(65535); save("udp", q)
        if refused(q): s.sendto(refused(q), src)
def tcp(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 53)); s.listen()
    while True:
        c, _ = s.accept(); c.settimeout(1); stream = b""; buf = b""
        try:
            while True:
                chunk = c.recv(65535)
                if not chunk: break
                stream += chunk; buf += chunk
                while len(buf) >= 2 and len(buf) >= 2 + int.from_bytes(buf[:2], "big"):
                    ln = int.from_bytes(buf[:2], "big"); q = buf[2:2 + ln]; buf = buf[2 + ln:]
                    save("frame", q); r = refused(q)
                    c.sendall(len(r).to_bytes(2, "big") + r)
        except Exception:
            pass
        if stream: save("tcp", stream)
        c.close()
for fam, a in [(socket.AF_INET, "198.18.0.2"), (socket.AF_INET6, "fd00:18::2")]:
    threading.Thread(target=udp, args=(fam, a), daemon=True).start()
    threading.Thread(target=tcp, args=(fam, a), daemon=True).start()
threading.Event().wait()
EOF
disown
sleep 0.5
dig_q() { in_ns dig +tries=1 +time=1 "$@" >/dev/null 2>&1 || true; }
kdig_q() { in_ns kdig +retry=0 +timeout=1 "$@" >/dev/null 2>&1 || true; }
for server in @198.18.0.2 @fd00:18::2; do
    dig_q "$server" kubernetes.default.svc.cluster.local A
    dig_q "$server" www.example.com AAAA +noedns
    dig_q "$server" health-check.localdns.local A
    dig_q "$server" a.b.c.d.internal.cloudapp.net A
    dig_q "$server" x.reddog.microsoft.com A
    dig_q "$server" big.example TXT +bufsize=4096 +dnssec
    dig_q "$server" example.com ANY +cd +nocookie
    dig_q "$server" _dns._udp.kube-dns.kube-system.svc.cluster.local SRV +nsid
    dig_q "$server" 10.0.0.10.in-addr.arpa PTR +subnet=10.1.0.0/16
    dig_q "$server" example.com A +bufsize=0
    dig_q "$server" example.com A +bufsize=65535 +ednsopt=65001:deadbeef
    dig_q "$server" . NS +norecurse
    dig_q "$server" WwW.ExAmPlE.CoM A +tcp
    dig_q "$server" kubernetes.default.svc.cluster.local A +tcp +keepopen
    kdig_q "$server" kubernetes.default.svc.cluster.local A
    kdig_q "$server" www.example.com AAAA +nsid +padding=128
    kdig_q "$server" big.example TXT +dnssec +bufsize=1232
    kdig_q "$server" www.example.com A +tcp
    kdig_q "$server" www.example.com A +notcflag +noedns +cookie
done
# Several queries on one TCP connection (pipelining), as kdig sends them.
in_ns kdig +retry=0 +timeout=1 @198.18.0.2 +tcp +keepopen a.example A b.example AAAA c.example TXT >/dev/null 2>&1 || true
sleep 0.5
for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
for f in "$tmp"/cap/udp-* "$tmp"/cap/frame-*; do
    [[ -e $f ]] && cp "$f" "$corpus/client_query/dig-$(basename "$f")"
done
for f in "$tmp"/cap/tcp-*; do
    [[ -e $f ]] && cp "$f" "$corpus/tcp_stream/dig-$(basename "$f")"
done

# ---- replies from dnsmasq and unbound ---------------------------------------------------------
in_ns dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --no-poll \
    --bind-interfaces --port=53 --user=root --group=root --pid-file= --local-ttl=60 \
    --listen-address=198.18.0.3 \
    --host-record=kubernetes.default.svc.cluster.local,10.0.0.1 \
    --host-record=www.example.com,198.51.100.10 --address=/reddog.microsoft.com/ \
    --txt-record=big.example,"$(printf 'x%.0s' {1..250})","$(printf 'y%.0s' {1..250})" \
    >/dev/null 2>&1 &
disown
cat >"$tmp/unbound.conf" <<EOF
server:
  interface: 198.18.0.4
  port: 53
  do-daemonize: no
  username: ""
  chroot: ""
  directory: "$tmp"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  num-threads: 1
  module-config: "iterator"
  access-control: 0.0.0.0/0 allow
  local-zone: "example." static
  local-zone: "cluster.local." static
  local-data: 'kubernetes.default.svc.cluster.local. 30 IN A 10.0.0.1'
  local-data: 'www.example.com. 60 IN A 198.51.100.10'
  local-data: 'www.example.com. 60 IN AAAA 2001:db8::10'
  local-data: 'big.example. 60 IN TXT "$(printf 'a%.0s' {1..250})" "$(printf 'b%.0s' {1..250})" "$(printf 'c%.0s' {1..250})"'
  local-data: 'x. 60 IN A 192.0.2.1'
remote-control:
  control-enable: no
EOF
in_ns unbound -d -c "$tmp/unbound.conf" >/dev/null 2>&1 &
disown
sleep 1.5

# The fuzz targets build their queries from fuzz_support::NAMES in a fixed layout; this writes
# seeds in those layouts with the real servers' replies inside.
in_ns python3 - "$corpus" <<'EOF'
import os, socket, struct, sys
corpus = sys.argv[1]
NAMES = ["kubernetes.default.svc.cluster.local", "www.example.com", "health-check.localdns.local",
         "a.reddog.microsoft.com", "a.b.c.d.internal.cloudapp.net", "big.example", "nx.example", "x"]
def build_query(qid, name, case_bits, qtype, edns):
    # Mirrors fuzz_support::build_query.
    p = struct.pack(">HBBHHHH", qid, 1, 0, 1, 0, 0, 1 if edns else 0)
    letter = 0; wire = b""
    for label in name.split("."):
        lb = bytearray(label.lower().encode())
        for i, b in enumerate(lb):
            if chr(b).islower():
                if (case_bits >> (letter % 32)) & 1: lb[i] = ord(chr(b).upper())
                letter += 1
        wire += bytes([len(lb)]) + bytes(lb)
    p += wire + b"\0" + struct.pack(">HH", qtype, 1)
    if edns:
        size, do = edns
        p += b"\0\0\x29" + struct.pack(">H", size) + bytes([0, 0, 0x80 if do else 0, 0, 0, 0])
    return p
def ask(server, q):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
    s.sendto(q, (server, 53))
    try: return s.recv(65535)
    except socket.timeout: return None
def write(target, name, data):
    open(os.path.join(corpus, target, name), "wb").write(data)
n = 0
for server, tag in [("198.18.0.3", "dnsmasq"), ("198.18.0.4", "unbound")]:
    for i, name in enumerate(NAMES):
        for qtype in (1, 28, 16):
            for edns in (None, (1232, False), (4096, True)):
                sent_id = 0x1234 + n; n += 1
                case = 0x0f0f0f0f
                q = build_query(sent_id, name, case, qtype, edns)
                r = ask(server, q)
                if r is None: continue
                base = f"{tag}-{i}-{qtype}-{'e' if edns else 'n'}{n}"
                # upstream_reply: name idx, our case, client case, qtype, edns flag, id, mode 0 (raw), reply
                hdr = struct.pack(">BIIHBHB", i, case, 0xffffffff ^ case, qtype, 1 if edns else 0, sent_id, 0)
                if edns is None or edns[0] == 1232:
                    write("upstream_reply", base, hdr + r)
                # cache: limits, then op 1 (raw put) and op 2 (get), with the same name/type
                limits = bytes([31]) + struct.pack(">H", 40000) + bytes([5]) + struct.pack(">HH", 3600, 3600)
                qtype_sel = {1: 0, 28: 1, 16: 2}[qtype] if qtype in (1, 28) else 2
                op_flags = 0x10 if edns else 0
                put = bytes([1 | op_flags, i, qtype_sel]) + struct.pack(">I", case) + struct.pack(">H", len(r)) + r
                get = bytes([2 | op_flags, i, qtype_sel]) + struct.pack(">I", 0)
                later = bytes([3, 0, 0]) + struct.pack(">I", 0) + struct.pack(">H", 70)
                write("cache", base, limits + put + get + later + get)
                write("client_query", f"fz-{base}", q)
# udp_relay: flags, max_inflight, then steps: a raw query, a built query, an honest reply to the
# last upstream send, time passing.
for flags in (0x01, 0x05, 0x02, 0x19, 0x00):
    seed = bytes([flags, 15])
    if flags & 3 >= 2:
        seed += bytes([4]) + struct.pack(">H", 4000)
    q = build_query(7, NAMES[0], 0, 1, None)
    seed += bytes([0]) + struct.pack(">H", len(q)) + q
    # a built query: name 1, case, qtype A, EDNS 1232 without DO, ID 9
    seed += bytes([1, 1]) + struct.pack(">I", 0x12345678) + bytes([0, 1]) + struct.pack(">HB", 1232, 0) + struct.pack(">H", 9)
    # an honest reply to upstream send 0: NOERROR, one A record with TTL 60, uncut
    seed += bytes([3]) + struct.pack(">H", 0) + bytes([0, 0]) + struct.pack(">I", 0) + bytes([1]) + struct.pack(">I", 60) + bytes([0, 9]) + struct.pack(">H", 0) + bytes([7])
    # 1.5 s pass
    seed += bytes([6]) + struct.pack(">H", 1500)
    write("udp_relay", f"relay-{flags:02x}", seed)
EOF
for f in "$corpus"/client_query/dig-udp-*; do
    # The same datagrams, as a raw query step of the relay target.
    len=$(stat -c %s "$f")
    { printf '\x01\x0f\x00'; printf "\\x$(printf %02x $((len >> 8)))\\x$(printf %02x $((len & 255)))"; cat "$f"; printf '\x06\x0b\xb8'; } \
        >"$corpus/udp_relay/$(basename "$f")"
done
for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done

# ---- discovery: real tool output and the fixtures ----------------------------------------------
rules="$tmp/nat.rules"
{
    echo '*nat'
    echo ':KUBE-SERVICES - [0:0]'
    echo ':KUBE-MARK-MASQ - [0:0]'
    echo ':KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]'
    echo ':KUBE-SVC-ERIFXISQEP7F7OF4 - [0:0]'
    echo ':KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]'
    echo ':KUBE-SEP-YIL6JZP7A3QYXJU2 - [0:0]'
    echo ':KUBE-SEP-ZP3FB6NMPNCO4VBJ - [0:0]'
    echo '-A KUBE-SERVICES -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU'
    echo '-A KUBE-SERVICES -d 10.0.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4'
    echo '-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-MARK-MASQ'
    echo '-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.0.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ'
    echo '-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.5:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-IT2ZTR26TO4XFPTO'
    echo '-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.1.7:53" -j KUBE-SEP-YIL6JZP7A3QYXJU2'
    echo '-A KUBE-SVC-ERIFXISQEP7F7OF4 -m comment --comment "kube-system/kube-dns:dns-tcp -> 10.244.0.5:53" -j KUBE-SEP-ZP3FB6NMPNCO4VBJ'
    echo '-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.5/32 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ'
    echo '-A KUBE-SEP-IT2ZTR26TO4XFPTO -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53'
    echo '-A KUBE-SEP-YIL6JZP7A3QYXJU2 -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.1.7:53'
    echo '-A KUBE-SEP-ZP3FB6NMPNCO4VBJ -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp" -m tcp -j DNAT --to-destination 10.244.0.5:53'
    echo 'COMMIT'
} >"$rules"
in_ns iptables-restore "$rules"
for chain in KUBE-SERVICES KUBE-SVC-TCOU7JCQXEZGVUNU KUBE-SEP-IT2ZTR26TO4XFPTO KUBE-SEP-YIL6JZP7A3QYXJU2; do
    in_ns iptables -w -t nat -S "$chain" >"$corpus/iptables/$chain.txt"
done
cat >"$corpus/iptables/ipv6-endpoint.txt" <<'EOF'
-N KUBE-SEP-X
-A KUBE-SEP-X -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:10:244::5]:53
EOF
cp ../tests/fixtures/nftables/*.json "$corpus/nftables/"
cp ../tests/fixtures/cilium/*.json "$corpus/cilium/"
cp ../tests/fixtures/ipvs/*.txt "$corpus/ipvs/"
printf '# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8).\n# Do not edit.\n\nnameserver 168.63.129.16\nsearch abc.internal.cloudapp.net\n' >"$corpus/resolv_conf/azure.conf"
printf 'nameserver 169.254.10.10\n' >"$corpus/resolv_conf/only-localdns.conf"
printf 'nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n' >"$corpus/resolv_conf/stub.conf"
printf 'nameserver fd00::53\nnameserver 168.63.129.16\nnameserver fe80::1%%1\nnameserver fe80::1%%lo\n' >"$corpus/resolv_conf/ipv6-zones.conf"
printf '; comment\n  nameserver   10.0.0.2   # trailing comment\noptions edns0 trust-ad\nnameserver\nnameserver not-an-ip\nnameserver 10.0.0.3;x\ngarbage line\n\0\377\nnameserver fe80::1%%no-such-interface\n' >"$corpus/resolv_conf/messy.conf"
echo "corpus: $(find "$corpus" -type f | wc -l) files"
for d in "$corpus"/*/; do echo "  $(basename "$d"): $(find "$d" -type f | wc -l)"; done
