"""`status --watch`: every engine's counters, read where the deployment's record says each
engine listens (over SSH the plan's address, under Slurm its node's), judged by
:mod:`pdlaunch.observe.watch` each refresh."""

from __future__ import annotations

import time

import typer
from rich.markup import escape
from rich.table import Table

from pdlaunch import doctor
from pdlaunch.cli.common import EXIT_FAILED, failed, out, print_json
from pdlaunch.observe import health
from pdlaunch.observe import watch as watch_mod
from pdlaunch.plan import lease as kvlease
from pdlaunch.runtime import record, record_store
from pdlaunch.runtime.state import StateError


def watch(deployment: str, backend: str, interval: float, count: int | None, as_json: bool) -> None:
    """Read every engine's /metrics each ``interval`` and print what changed
    (pdlaunch.observe.watch), where the deployment's record says each engine listens (a Slurm
    job: on its node)."""
    try:
        rec = record_store.find(deployment, backend)
    except StateError as exc:
        failed(str(exc))
    if rec is None:
        failed(f"{deployment}: nothing recorded (was it started with `pdlaunch up`?)")
    engines = [p for p in rec.engines() if p.metrics_url or p.host is None]
    unplaced = ""
    if isinstance(rec.handle, record.SlurmHandle):
        unplaced = f"not placed: Slurm {rec.handle.job_said}"

    lease = _lease(rec)
    texts: dict[str, str] = {}  # the last /metrics text read of each engine

    def snapshot() -> dict[str, watch_mod.Counters | str]:
        snap: dict[str, watch_mod.Counters | str] = {}
        for p in engines:
            if p.metrics_url is None:
                snap[p.name] = unplaced or "no /metrics recorded"
                continue
            try:
                text = health.get_text(p.metrics_url, timeout=5.0)
                snap[p.name] = watch_mod.Counters.parse(text)
                texts[p.name] = text
            except OSError as exc:
                snap[p.name] = f"no /metrics: {exc}"
        return snap

    before = snapshot()
    seen_bad = False
    done = 0
    try:
        while count is None or done < count:
            time.sleep(interval)
            texts_before = dict(texts)
            now = snapshot()
            rows = []
            for p in engines:
                b, n = before.get(p.name), now.get(p.name)
                if isinstance(b, watch_mod.Counters) and isinstance(n, watch_mod.Counters):
                    row = watch_mod.judge(p.name, p.role, b, n)
                    row.warnings.extend(
                        watch_mod.lease_warnings(
                            p.name, p.role, texts_before.get(p.name), texts[p.name], lease
                        )
                    )
                    rows.append(row)
                else:
                    why = n if isinstance(n, str) else str(b)
                    rows.append(
                        watch_mod.WatchRow(
                            p.name, p.role, watch_mod.Counters(), watch_mod.Counters(), [why]
                        )
                    )
            seen_bad = seen_bad or any(not r.ok for r in rows)
            print_watch(deployment, rows, interval, as_json)
            before = now
            done += 1
    except KeyboardInterrupt:
        pass
    if seen_bad:
        raise typer.Exit(EXIT_FAILED)


def _lease(rec: record.Record) -> kvlease.Lease | None:
    """The prefills' KV lease, from the recorded topology planned again (doctor does the
    same); None when it cannot be read: no lease warning then."""
    try:
        plan = doctor.load_topology(doctor.resolve(rec)).plan
    except (doctor.DoctorError, StateError, OSError, ValueError):
        return None
    return kvlease.plan_lease(plan) if plan is not None else None


def print_watch(deployment: str, rows: list, interval: float, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "deployment": deployment,
                "time": round(time.time(), 3),
                "processes": [
                    {
                        "process": r.process,
                        "role": r.role,
                        "requests": r.delta.requests,
                        "local_compute_tokens": r.delta.local,
                        "kv_transfer_tokens": r.delta.external,
                        "failed_transfers": r.delta.failed,
                        "expired_leases": r.delta.expired,
                        "flags": r.flags,
                        "warnings": r.warnings,
                    }
                    for r in rows
                ],
            }
        )
        return
    table = Table(title=f"{deployment}: last {interval:g}s", box=None, pad_edge=False)
    for col in ("process", "requests", "computed", "loaded (KV)", "failed", "expired", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rows:
        d = r.delta
        verdict = "[green]ok[/]" if r.ok else "[red]" + escape("; ".join(r.flags)) + "[/]"
        if r.warnings:
            verdict += " [yellow]" + escape("; ".join(r.warnings)) + "[/]"
        table.add_row(
            r.process,
            f"{d.requests:g}",
            f"{d.local:g}",
            f"{d.external:g}",
            f"{d.failed:g}",
            f"{d.expired:g}",
            verdict,
        )
    out.print(table)
