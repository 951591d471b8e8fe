"""The NIXL side-channel address of a node named by DNS: resolved on the node when it starts.

The prefill binds ``tcp://$VLLM_NIXL_SIDE_CHANNEL_HOST:port`` and hands the same string to
decode to dial (vllm ``nixl/base_scheduler.py:76`` reads it through ``vllm/envs.py:1735``,
default ``localhost``; every release pdlaunch knows reads it: spec/facts/vllm-*.json ``env``;
0.32's push mode hands decode's own value to prefill too, ``nixl/push_scheduler.py:180``).
A name there would be resolved twice, on two machines. So where a node has no
``hosts.<h>.address`` and its host is a name, its script resolves the name once, on the node,
before vLLM starts, as the GB200 guide does by hand (``export
VLLM_NIXL_SIDE_CHANNEL_HOST=$(hostname -i)``), and exports the address it got. The start
fails with a one-line message when the name resolves to nothing, to something that is not an
address of this node, or to a loopback address while peers on other machines must dial it
(Debian's /etc/hosts maps the own hostname to 127.0.1.1).

The plan's env value is the placeholder ``{pdlaunch:PDLAUNCH_NODE_ADDR}``, the notation the
Slurm backend uses for the values it decides at run time: there the job's driver sets
``PDLAUNCH_NODE_ADDR`` to the node's NodeAddr, over SSH the script itself does. Pure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from pdlaunch.plan.ports import Node, all_nodes
from pdlaunch.spec.addresses import host_key, is_ip_literal
from pdlaunch.spec.topology import Topology

#: The variable the node's address is in when the process script exports it.
NODE_ADDR = "PDLAUNCH_NODE_ADDR"
#: The one variable the plan fills with it (a user's `env:` value that merely looks like the
#: placeholder stays text).
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
#: The plan's env value for a variable the node's address fills at start.
PLACEHOLDER = "{pdlaunch:" + NODE_ADDR + "}"
#: The script's exit status when the address cannot be had.
EXIT_NO_ADDRESS = 94

#: ``pdl_resolve NAME``: the address the script exports, printed on one line, or nothing
#: (status 1). The name's first address that is not loopback, else its first (a name that
#: only means this machine), IPv4 first (``ahostsv4``, then ``ahosts`` for an IPv6-only
#: name); anything but hex digits, dots and colons is not taken for an address. Constant
#: text: the process script and `pdlaunch check` (check/probes/node_addr.py) run exactly this.
RESOLVE_SH = r"""pdl_resolve() {
    local db out
    for db in ahostsv4 ahosts; do
        out=$(getent "$db" -- "$1" 2>/dev/null | awk '
            $1 ~ /^[0-9A-Fa-f.:]+$/ && $1 !~ /^(127\.|::1$|::ffff:127\.)/ { print $1; ok = 1; exit }
            $1 ~ /^[0-9A-Fa-f.:]+$/ && first == "" { first = $1 }
            END { if (!ok && first != "") print first }') || out=
        if [ -n "$out" ]; then printf '%s\n' "$out"; return 0; fi
    done
    return 1
}"""


class NodeAddress(BaseModel):
    """A node whose side-channel address its script resolves at start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str  # the host name, resolved on the node
    # Engines of the deployment run on other machines: a loopback answer is refused there.
    peers_elsewhere: bool


def resolves_on_node(topo: Topology, host: str) -> bool:
    """Whether the node's NIXL side-channel address is resolved on the node: a host written
    as a name, with no ``hosts.<h>.address`` (an explicit address always wins)."""
    return (
        topo.kv_connector.kind == "nixl"
        and topo.settings_of(host).address is None
        and not is_ip_literal(host)
    )


def node_address(topo: Topology, node: Node) -> NodeAddress | None:
    if not resolves_on_node(topo, node.host):
        return None
    mine = host_key(node.host)
    elsewhere = any(host_key(n.host) != mine for n in all_nodes(topo))
    return NodeAddress(name=node.host, peers_elsewhere=elsewhere)


def on_node_hosts(topo: Topology) -> list[str]:
    """The hosts (as written, each once, in topology order) whose side-channel address is
    resolved on the node: what `validate` and `plan` tell the user."""
    hosts = [n.host for n in all_nodes(topo) if resolves_on_node(topo, n.host)]
    return list(dict.fromkeys(hosts))
