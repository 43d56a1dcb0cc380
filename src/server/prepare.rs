//! Everything that needs privilege, done once before serving: the listener addresses on `lo`, the listener sockets (and the metrics socket), then dropping every capability that
//! discovery does not still need.

use caps::Capability;

use crate::cli::Config;
use crate::discover::Source;
use crate::listen::{self, Bound};
use crate::{netlink, privilege};

/// What serving starts from.
pub struct Prepared {
    pub node: Bound,
    pub cluster: Bound,
    /// Non-blocking, like the listeners' TCP sockets; registered with the runtime by `serve`.
    pub metrics: Option<std::net::TcpListener>,
    /// Which upstream groups discovery fills (a group given by flags is never touched).
    pub owned: crate::discover::follow::Owned,
}

/// Runs on a runtime of the calling thread alone: capabilities belong to a thread, and threads
/// inherit them from the thread that starts them, so the serving runtime is started only after
/// the drop (its workers and blocking pool would otherwise keep every capability, and so would
/// the tools they run).
/// New flows go to us from the instant each socket is bound if `ours`, else to LocalDNS's.
pub async fn prepare(config: &Config, ours: bool) -> Result<Prepared, String> {
    // The listener addresses go on `lo`, where LocalDNS never deletes them; its own link
    // `localdns` is left as it is (see `netlink`). On standby they go on only when we take the
    // flows (see `standby`): while LocalDNS serves they are its link's alone.
    if config.link_setup && !config.standby {
        let outcome = netlink::claim_on_loopback(&crate::standby::lo_addresses(config))?;
        tracing::info!(
            on = netlink::LOOPBACK,
            added = ?outcome.added,
            already_there = ?outcome.present,
            "listener addresses in place"
        );
    }
    let metrics = config.metrics.map(|addr| {
        std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))
    });
    let metrics = metrics.transpose()?;
    let (node, cluster) = tokio::try_join!(
        listen::bind_listener(config.node_listen, config.bind_timeout, ours),
        listen::bind_listener(config.cluster_listen, config.bind_timeout, ours),
    )?;
    let owned = crate::discover::follow::Owned {
        node: config.node_upstreams.is_empty(),
        cluster: config.cluster_upstreams.is_empty(),
    };
    drop_privileges(config, owned);
    Ok(Prepared {
        node,
        cluster,
        metrics,
        owned,
    })
}

/// Everything that needed privilege is done (ports bound, link set up): keep only what discovery
/// still needs to read kube-proxy's rules, or nothing at all.
fn drop_privileges(config: &Config, owned: crate::discover::follow::Owned) {
    if !nix::unistd::geteuid().is_root() {
        tracing::debug!("not root: no capabilities to drop");
        return;
    }
    let reads_rules = owned.cluster
        && config
            .discovery
            .sources
            .iter()
            .any(|s| matches!(s, Source::Iptables | Source::Nftables | Source::Ipvs));
    // iptables, nft and ipvsadm talk netlink/netfilter (CAP_NET_ADMIN); iptables-legacy also opens
    // a raw socket (CAP_NET_RAW). On standby the listener addresses go on and off lo at each
    // takeover and hand-back (CAP_NET_ADMIN).
    let mut keep = Vec::new();
    if reads_rules || (config.standby && config.link_setup) {
        keep.push(Capability::CAP_NET_ADMIN);
    }
    if reads_rules {
        keep.push(Capability::CAP_NET_RAW);
    }
    match privilege::keep_only(&keep) {
        Ok(()) => {
            tracing::info!(kept = ?keep.iter().map(ToString::to_string).collect::<Vec<_>>(), "dropped every other capability")
        }
        Err(e) => tracing::warn!("{e}; running with the capabilities it was started with"),
    }
}
