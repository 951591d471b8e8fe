"""Planned ports: free on their host (``ss -ltnH``), and reachable from the peer that must
connect (a Python snippet whose one-line JSON format pdlaunch owns)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Probe,
    ProbeContext,
    need,
    probe_json,
    q,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status


def parse_ss_listeners(text: str) -> list[tuple[str, int]]:
    """``ss -ltnH``: ``[(address, port)]``; ``*``/``0.0.0.0``/``[::]`` kept as printed,
    brackets and ``%iface`` scopes stripped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        addr, _, port = parts[3].rpartition(":")
        if not port.isdigit():
            continue
        addr = addr.strip("[]").split("%")[0]
        out.append((addr, int(port)))
    return out


def eval_ports_free(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``ports`` (``{port: purpose}`` or a list of ports the plan binds here).

    Any listener on the port blocks it, whatever the address: a socket on
    127.0.0.1:P makes a bind to 0.0.0.0:P fail with EADDRINUSE.
    """
    if out.rc != 0:
        return [unparsed(ctx, "ss -ltn", out)]
    planned = ctx.params.get("ports") or {}
    if not isinstance(planned, Mapping):
        planned = {int(p): "" for p in planned}
    taken: dict[int, list[str]] = {}
    for addr, port in parse_ss_listeners(out.stdout):
        taken.setdefault(port, []).append(addr)
    results = []
    for port, purpose in sorted((int(k), v) for k, v in planned.items()):
        label = f"port {port}" + (f" ({purpose})" if purpose else "")
        if port in taken:
            addrs = ", ".join(sorted(set(taken[port])))
            results.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"{label} already in use on {addrs}",
                    f"find the owner with `ss -ltnp 'sport = :{port}'` and stop it, or "
                    "change the port in the topology",
                    port=port,
                    addresses=addrs,
                )
            )
        else:
            results.append(row(ctx, Status.OK, f"{label} free", port=port))
    return results or [row(ctx, Status.SKIP, "no planned ports for this host")]


def _listen_calls(facts: HostFacts) -> list[Call]:
    ports = {pp.port: f"{pp.purpose}, {proc.name}" for proc in facts.processes for pp in proc.ports}
    return [Call({"ports": ports})]


# ------------------------------------------------------------------------ reachability

#: run on the peer that must connect; prints one JSON line (format owned by pdlaunch). The
#: reachability snippets and the port holder use the standard library only, so they run with
#: ``-S``: no site import (a venv's .pth files cost ~6 ms and more per interpreter).
REACH_SNIPPET = """import json,socket,sys
h,p,t=sys.argv[1],int(sys.argv[2]),float(sys.argv[3])
try:
    socket.create_connection((h,p),timeout=t).close()
    r={"result":"open"}
except TimeoutError:
    r={"result":"timeout"}
except ConnectionRefusedError:
    r={"result":"refused"}
except OSError as e:
    r={"result":"error","errno":e.errno,"detail":str(e)}
r.update(pdlaunch_probe=1,host=h,port=p)
print(json.dumps(r,sort_keys=True))"""

#: many reachability tests in one interpreter, all at once (non-blocking connects + select:
#: no threads, stdlib modules that import fast); prints one line per target in exactly the
#: format of REACH_SNIPPET, so :func:`eval_port_reach` judges both
REACH_BATCH_SNIPPET = """import errno,json,os,select,socket,sys,time
t=float(sys.argv[1]);targets=json.loads(sys.argv[2]);res={};pend={}
def kind(e):
    if e==0:
        return {"result":"open"}
    if e==errno.ECONNREFUSED:
        return {"result":"refused"}
    if e==errno.ETIMEDOUT:
        return {"result":"timeout"}
    return {"result":"error","errno":e,"detail":str(OSError(e,os.strerror(e)))}
for i,(h,p) in enumerate(targets):
    try:
        fam,st,pr,_,sa=socket.getaddrinfo(h,int(p),0,socket.SOCK_STREAM)[0]
        s=socket.socket(fam,st,pr)
        s.setblocking(False)
        e=s.connect_ex(sa)
        if e in (errno.EINPROGRESS,errno.EWOULDBLOCK,errno.EALREADY):
            pend[s]=i
        else:
            res[i]=kind(e)
            s.close()
    except OSError as e:
        res[i]={"result":"error","errno":e.errno,"detail":str(e)}
end=time.monotonic()+t
while pend:
    left=end-time.monotonic()
    if left<=0:
        break
    _,ready,_=select.select([],list(pend),[],left)
    for s in ready:
        res[pend.pop(s)]=kind(s.getsockopt(socket.SOL_SOCKET,socket.SO_ERROR))
        s.close()
for s,i in pend.items():
    res[i]={"result":"timeout"}
    s.close()
for i,(h,p) in enumerate(targets):
    r=res[i]
    r.update(pdlaunch_probe=1,host=h,port=int(p))
    print(json.dumps(r,sort_keys=True))"""


#: run on a reachability target before the peers connect: listens on every planned port that
#: is free, so "refused" can only mean something between the hosts rejects the connection (a
#: REJECT firewall rule answers exactly like a port nobody listens on). Prints its pid, one
#: "held ADDRESS PORT" line per port it holds, then "ready"; the runner kills it after the
#: test, and it exits by itself after argv[2] seconds whatever happens.
HOLD_SNIPPET = """import json,os,select,socket,sys,time
ts=json.loads(sys.argv[1]);ss=[]
print(os.getpid(),flush=True)
for h,p in ts:
    try:
        s=socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET)
        s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
        s.bind((h,int(p)));s.listen(64);ss.append(s)
        print("held %s %d"%(h,int(p)),flush=True)
    except OSError:
        pass
print("ready",flush=True)
end=time.monotonic()+float(sys.argv[2])
while ss and time.monotonic()<end:
    for s in select.select(ss,[],[],0.5)[0]:
        s.accept()[0].close()"""


def hold_command(python: str, targets: Iterable[tuple[str, int]], max_s: float) -> str:
    listed = json.dumps([[h, int(p)] for h, p in targets])
    return f"exec {q(python)} -S -c {q(HOLD_SNIPPET)} {q(listed)} {float(max_s)}"


def _cmd_reach(params: Mapping[str, Any]) -> str:
    py = params.get("python", "python3")
    return (
        f"{need(q(py))}{q(py)} -S -c {q(REACH_SNIPPET)} "
        f"{q(params['host'])} {int(params['port'])} {float(params.get('timeout', 3))}"
    )


def reach_batch_command(python: str, timeout: float, targets: Iterable[tuple[str, int]]) -> str:
    """One interpreter on the source host tests every ``(address, port)`` at once."""
    listed = json.dumps([[h, int(p)] for h, p in targets])
    return (
        f"{need(q(python))}{q(python)} -S -c {q(REACH_BATCH_SNIPPET)} {float(timeout)} {q(listed)}"
    )


def split_reach_batch(stdout: str) -> dict[tuple[str, int], str]:
    """The batch's output as ``{(address, port): the line REACH_SNIPPET would print}``."""
    lines: dict[tuple[str, int], str] = {}
    for line in stdout.splitlines():
        data = probe_json(line)
        if data is not None:
            lines[(str(data.get("host")), int(data.get("port", 0)))] = line
    return lines


def eval_port_reach(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Output of :data:`REACH_SNIPPET` run on the peer that must connect."""
    data = probe_json(out.stdout)
    if data is None:
        return [unparsed(ctx, "reachability probe", out)]
    data = {**data, "held": bool(ctx.params.get("held"))}
    dest = f"{data.get('host')}:{data.get('port')}"
    result = data.get("result")
    if result == "open":
        return [row(ctx, Status.OK, f"{dest} reachable (a listener answers)", **data)]
    if result == "refused" and ctx.params.get("held"):
        return [
            row(
                ctx,
                Status.FAIL,
                f"{dest} refused although pdlaunch was listening on it: something between "
                "the hosts rejects the connection (a REJECT firewall rule, a TCP reset)",
                "allow the port in the firewall (iptables/nft, security group) between these hosts",
                **data,
            )
        ]
    if result == "refused":
        msg = f"{dest} reachable (host answers, nothing listening yet)"
        return [row(ctx, Status.OK, msg, **data)]
    if result == "timeout":
        return [
            row(
                ctx,
                Status.FAIL,
                f"{dest} timed out: filtered or unroutable",
                "open the port in the firewall / security group between these hosts",
                **data,
            )
        ]
    return [
        row(
            ctx,
            Status.FAIL,
            f"{dest} unreachable: {data.get('detail', result)}",
            "check the address in the topology, DNS and routing between these hosts",
            **data,
        )
    ]


# ---------------------------------------------------------------------------- probes

LISTEN = Probe(
    "ports.listen",
    "planned ports free",
    need("ss") + "ss -ltnH",
    eval_ports_free,
    "ss -ltn",
    tool="ss",
    install="install iproute2",
    calls=_listen_calls,
)
REACH = Probe(
    "ports.reach",
    "peer can reach planned port",
    _cmd_reach,
    eval_port_reach,
    "reachability probe",
    tool="python3",
    install="install python3 on the peer",
    scope="pair",
    timeout_s=15.0,
)

PROBES = (LISTEN, REACH)
