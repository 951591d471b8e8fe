"""Reachability: who must connect to whom, one batched connect test per source host, and the
listeners that hold each free target port while its peers connect (so "refused" there is a
firewall's answer, not an empty port)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pdlaunch.check.batch import Job
from pdlaunch.check.probes import CommandOutput, ProbeContext
from pdlaunch.check.probes.node_addr import resolved_addresses
from pdlaunch.check.probes.ports import (
    REACH,
    hold_command,
    reach_batch_command,
    split_reach_batch,
)
from pdlaunch.check.results import CheckResult
from pdlaunch.check.targets import HostTarget, probe_python
from pdlaunch.hosts import Host, HostError, parallel
from pdlaunch.plan.build import Plan

Holder = tuple[Host, "int | None", Any]  # (host, pid of its listener, the open stream)


@dataclass(frozen=True)
class Reach:
    source: str  # process name
    dest: str  # process name
    address: str
    port: int
    purpose: str
    # The name dest's script resolves on its node at start (plan/node_addr.py): the
    # address it got there is what peers really dial (resolved_reaches).
    resolved_from: str | None = None

    @property
    def label(self) -> str:
        return f"{self.source} -> {self.dest}"


def reach_pairs(plan: Plan) -> list[Reach]:
    """Who must connect to whom: decode -> every prefill NIXL side channel (or Mooncake
    producer port), router -> every instance HTTP API, DP worker node -> its master's RPC."""
    out: list[Reach] = []
    prefill, decode = plan.by_role("prefill"), plan.by_role("decode")
    for d in decode:
        for pf in prefill:
            # decode dials the side-channel host the plan advertises (nodeenv: the node's
            # hosts.<h>.address, else its host)
            for pp in pf.ports:
                if pp.kind in ("nixl_side_channel", "mooncake_kv"):
                    side = pp.kind == "nixl_side_channel"
                    dest = (pf.kv_host or pf.host) if side else pf.host
                    name = pf.node_addr.name if side and pf.node_addr else None
                    out.append(Reach(d.name, pf.name, dest, pp.port, pp.purpose, name))
    for r in plan.by_role("router"):
        for proc in [*prefill, *decode]:
            for pp in proc.ports:
                if pp.kind == "http":
                    out.append(Reach(r.name, proc.name, proc.host, pp.port, pp.purpose))
    for proc in [*prefill, *decode]:
        if proc.node_index == 0:
            continue
        for m in plan.processes:
            if m.instance == proc.instance and m.node_index == 0:
                for pp in m.ports:
                    if pp.kind == "dp_rpc":
                        out.append(Reach(proc.name, m.name, m.host, pp.port, pp.purpose))
    return out


def resolved_reaches(
    reaches: list[Reach], by_proc: Mapping[str, HostTarget], results: list[CheckResult]
) -> list[Reach]:
    """Side channels whose node resolves its name at start, dialled at the address the node
    resolved (node_addr.resolve, phase 1), not at the name as the peer would resolve it;
    where the node found none, the name (the probe has said why)."""
    found = resolved_addresses(results)
    out = []
    for r in reaches:
        addr = found.get((by_proc[r.dest].label, r.resolved_from or ""))
        out.append(replace(r, address=addr) if r.resolved_from and addr else r)
    return out


def reach_job(
    reaches: list[Reach], python: str, timeout: float, held: set[tuple[str, int]] = frozenset()
) -> Job:
    """Every reachability test of one source host in one interpreter; each target's line
    is judged by the single-target probe's evaluator. ``held``: targets pdlaunch listened on
    during the test (there, "refused" is a firewall's answer, not an empty port)."""
    targets = sorted({(r.address, r.port) for r in reaches})

    def evaluate(out: CommandOutput) -> list[CheckResult]:
        lines = split_reach_batch(out.stdout)
        results = []
        for r in reaches:
            params = {"host": r.address, "port": r.port, "held": (r.address, r.port) in held}
            ctx = ProbeContext(r.label, True, params)
            one = CommandOutput(out.rc, lines.get((r.address, r.port), ""), out.stderr)
            for res in REACH.judge(one, ctx):
                results.append(replace(res, message=f"{r.purpose}: {res.message}"))
        return results

    return Job(
        reach_batch_command(python, timeout, targets),
        REACH.timeout_s + timeout,
        evaluate,
        REACH.id,
        True,
        "",
        REACH,
    )


def hold_ports(
    reaches: list[Reach],
    by_proc: Mapping[str, HostTarget],
    opened: Mapping[tuple, Host],
    reach_timeout: float,
) -> tuple[set[tuple[str, int]], list[Holder]]:
    """Start a listener on every reach target's host (one process per host) on the planned
    ports that are free; returns the (address, port) pairs held and the holders to release."""
    by_dest: dict[tuple, list[tuple[str, int]]] = {}
    for r in reaches:
        t = by_proc[r.dest]
        if t.key in opened:
            by_dest.setdefault(t.key, []).append((r.address, r.port))
    targets = {t.key: t for t in by_proc.values()}
    held: set[tuple[str, int]] = set()
    holders: list[Holder] = []
    lock = threading.Lock()

    def one(key: tuple) -> None:
        host, ports = opened[key], sorted(set(by_dest[key]))
        cmd = hold_command(probe_python(targets[key]), ports, reach_timeout + 60)
        try:
            stream = host.open_stream(cmd)
        except HostError:
            return  # judged as before: "refused" then means nothing listens
        buf, deadline, pid = b"", time.monotonic() + 30, None
        while b"ready\n" not in buf and time.monotonic() < deadline:
            chunk = stream.read(0.5)
            if chunk is None:
                break
            buf += chunk
        lines = buf.decode(errors="replace").splitlines()
        if lines and lines[0].strip().isdigit():
            pid = int(lines[0])
        with lock:
            # The stream stays open until release: closing it kills a local holder at once.
            holders.append((host, pid, stream))
            for line in lines:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "held" and "ready" in lines:
                    held.add((parts[1], int(parts[2])))

    parallel(one, list(by_dest))
    return held, holders


def release_ports(holders: list[Holder]) -> None:
    """Stop every port holder, all hosts at once (one after another cost 5 s at 32 hosts)."""

    def release_one(holder: Holder) -> None:
        host, pid, stream = holder
        if pid is not None:
            with contextlib.suppress(HostError):
                host.run(f"kill {int(pid)} 2>/dev/null; true", timeout=30)
        stream.close()

    parallel(release_one, holders)
