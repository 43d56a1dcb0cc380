//! Raw UDP/TCP sockets through libc, for what std does not offer: SO_REUSEPORT, buffer sizes
//! above `rmem_max` (SO_RCVBUFFORCE, we run as root), kernel receive timestamps, and batches of
//! datagrams per system call (`recvmmsg`/`sendmmsg`).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Socket buffer size asked for on every socket: deep enough that a burst of a few thousand
/// datagrams is queued, not dropped.
pub const SOCKET_BUFFER: usize = 4 << 20;
/// Largest datagram kept per slot of a batch.
pub const DGRAM: usize = 4096;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid; we write one sockaddr_in(6) into it.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a c_int of the stated size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as u32,
        )
    })
    .map(|_| ())
}

/// Forces both buffers to [`SOCKET_BUFFER`] (falls back to the capped SO_RCVBUF when not root).
fn big_buffers(fd: RawFd) {
    let v = SOCKET_BUFFER as libc::c_int;
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
    }
}

fn family(ip: &IpAddr) -> libc::c_int {
    if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

/// A UDP socket bound to `bind` (SO_REUSEPORT when asked), big buffers.
pub fn udp_bound(bind: SocketAddr, reuse_port: bool, nonblocking: bool) -> io::Result<OwnedFd> {
    let mut ty = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe { OwnedFd::from_raw_fd(cvt(libc::socket(family(&bind.ip()), ty, 0))?) };
    if reuse_port {
        setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    big_buffers(fd.as_raw_fd());
    let (ss, len) = sockaddr(&bind);
    // SAFETY: ss holds a valid sockaddr of length len.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(fd)
}

/// A non-blocking UDP socket on a random port, connected to `server` (the kernel then drops
/// datagrams from anyone else), with kernel receive timestamps (SO_TIMESTAMPNS) on.
pub fn udp_client(server: SocketAddr) -> io::Result<OwnedFd> {
    let fd = udp_connected(server)?;
    setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
    Ok(fd)
}

/// A non-blocking UDP socket on a random port, connected to `server`.
pub fn udp_connected(server: SocketAddr) -> io::Result<OwnedFd> {
    let any: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal");
    let fd = udp_bound(any, false, true)?;
    let (ss, len) = sockaddr(&server);
    // SAFETY: as in bind.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(fd)
}

/// Starts a non-blocking TCP connect to `server` (completion shows as POLLOUT).
pub fn tcp_connect_start(server: SocketAddr) -> io::Result<OwnedFd> {
    let ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: plain socket(2).
    let fd = unsafe { OwnedFd::from_raw_fd(cvt(libc::socket(family(&server.ip()), ty, 0))?) };
    let _ = setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    let (ss, len) = sockaddr(&server);
    // SAFETY: as in bind.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(fd)
}

/// The pending error of a socket (SO_ERROR), e.g. after a non-blocking connect.
pub fn socket_error(fd: RawFd) -> Option<io::Error> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: reads one c_int.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Some(io::Error::last_os_error());
    }
    (v != 0).then(|| io::Error::from_raw_os_error(v))
}

/// Buffers for up to `cap` datagrams moved by one `recvmmsg` or `sendmmsg`, with their peer
/// addresses and (on receive) kernel timestamps.
pub struct Batch {
    pub cap: usize,
    bufs: Vec<u8>,
    pub lens: Vec<usize>,
    pub addrs: Vec<libc::sockaddr_storage>,
    addr_lens: Vec<libc::socklen_t>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    cmsgs: Vec<[u64; 8]>,
    /// Kernel receive time of each datagram (CLOCK_REALTIME ns), 0 if none came.
    pub stamps: Vec<u64>,
}

impl Batch {
    pub fn new(cap: usize) -> Batch {
        Batch {
            cap,
            bufs: vec![0; cap * DGRAM],
            lens: vec![0; cap],
            // SAFETY: all-zero sockaddr_storage / mmsghdr are valid values.
            addrs: vec![unsafe { zeroed() }; cap],
            addr_lens: vec![0; cap],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                cap
            ],
            hdrs: vec![unsafe { zeroed() }; cap],
            cmsgs: vec![[0; 8]; cap],
            stamps: vec![0; cap],
        }
    }

    pub fn buf(&self, i: usize) -> &[u8] {
        &self.bufs[i * DGRAM..i * DGRAM + self.lens[i]]
    }

    /// The whole slot `i`, to write a datagram into (then set `lens[i]`).
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bufs[i * DGRAM..(i + 1) * DGRAM]
    }

    /// Points the headers at the buffers. `with_addr`: fill/read msg_name; `lens_from`: iov
    /// lengths are the datagram lengths (send) rather than the whole slot (receive).
    fn wire(&mut self, n: usize, with_addr: bool, send: bool) {
        for i in 0..n {
            let base = self.bufs[i * DGRAM..].as_mut_ptr();
            self.iovs[i] = libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: if send { self.lens[i] } else { DGRAM },
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            if with_addr {
                h.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
                h.msg_namelen = if send {
                    self.addr_lens[i]
                } else {
                    size_of::<libc::sockaddr_storage>() as u32
                };
            } else {
                h.msg_name = std::ptr::null_mut();
                h.msg_namelen = 0;
            }
            if send {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            } else {
                h.msg_control = self.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
                h.msg_controllen = size_of::<[u64; 8]>();
            }
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    /// Receives up to `cap` datagrams. `flags`: MSG_DONTWAIT, or MSG_WAITFORONE on a blocking
    /// socket. Ok(0) when nothing is waiting.
    pub fn recv(&mut self, fd: RawFd, flags: libc::c_int) -> io::Result<usize> {
        let cap = self.cap;
        self.wire(cap, true, false);
        // SAFETY: the headers point into buffers owned by self, sized as declared.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                cap as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let n = r as usize;
        for i in 0..n {
            self.lens[i] = (self.hdrs[i].msg_len as usize).min(DGRAM);
            self.addr_lens[i] = self.hdrs[i].msg_hdr.msg_namelen;
            self.stamps[i] = stamp_of(&self.hdrs[i].msg_hdr);
        }
        Ok(n)
    }

    /// The length of the peer address of received slot `i`.
    pub fn addr_len(&self, i: usize) -> libc::socklen_t {
        self.addr_lens[i]
    }

    /// Sets the destination of slot `i` (unconnected sockets).
    pub fn set_addr(&mut self, i: usize, addr: libc::sockaddr_storage, len: libc::socklen_t) {
        self.addrs[i] = addr;
        self.addr_lens[i] = len;
    }

    /// Sends slots `from..to` (to their addresses when `with_addr`, else on a connected socket).
    /// Returns how many went; a full socket buffer (EAGAIN) counts as 0, not an error.
    pub fn send(
        &mut self,
        fd: RawFd,
        from: usize,
        to: usize,
        with_addr: bool,
    ) -> io::Result<usize> {
        if to <= from {
            return Ok(0);
        }
        self.wire(to, with_addr, true);
        // SAFETY: as in recv; the headers from..to were just pointed at their buffers.
        let r =
            unsafe { libc::sendmmsg(fd, self.hdrs[from..].as_mut_ptr(), (to - from) as u32, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ENOBUFS) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(r as usize)
    }
}

/// The SCM_TIMESTAMPNS of a received message, or 0.
fn stamp_of(h: &libc::msghdr) -> u64 {
    // SAFETY: walks the control buffer the kernel filled, with the CMSG_* macros' bounds checks.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// Waits until one of `fds` is readable (or writable, per its events) or `timeout_ns` passes.
/// Returns the number of ready descriptors.
pub fn wait(fds: &mut [libc::pollfd], timeout_ns: u64) -> usize {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: fds is a valid slice of pollfd; ts lives across the call.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    r.max(0) as usize
}

/// Makes sleeps precise to a microsecond (the default slack is 50 µs, the gap between two
/// queries at 20k QPS).
pub fn tight_timer_slack() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
}
