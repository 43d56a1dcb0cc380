//! Binding the listeners (`bind`), and steering flows within a port's SO_REUSEPORT group
//! (`steer`).
//!
//! LocalDNS's CoreDNS binds its listeners with SO_REUSEPORT, so ours do too: a socket from the
//! same user with SO_REUSEPORT joins the kernel's group for that address and port, LocalDNS can
//! bind while we still serve, and we can leave once it is ready. A group spreads flows over every
//! member, though, and a member may not answer: an orphaned CoreDNS, or a LocalDNS that is bound
//! but not yet serving. So while the fallback is in charge a classic BPF program on the group
//! (SO_ATTACH_REUSEPORT_CBPF) returns the index of our own socket; when we hand over (and when
//! the standby joins beside a LocalDNS that answers, in the same breath as the bind) it returns
//! any other member's. A program that picks other members stays when we close (our closing
//! sockets never get a flow); one that picks ours is detached first (SO_DETACH_REUSEPORT_BPF). The kernel numbers members in the order they joined and,
//! when one leaves, moves the last member into its slot; our index is the number of members that
//! were there before us (asked of sock_diag at bind time), and `Place` follows it as members
//! come and go. Port 0 (tests) is never shared.

mod bind;
mod steer;

pub use bind::{Bound, RECV_BUFFER, SEND_BUFFER, bind_listener, buffers};
pub use steer::Held;
