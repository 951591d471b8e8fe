"""Which cluster owns which slot (flock + state file), sweeping what a crashed run left, and
the ARP (neighbour) table limits all clusters share."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.support.netns.namespaces import (
    MAX_SLOTS,
    ROOT_PREFIX,
    STATE_DIR,
    NetnsError,
    leftovers,
    parse_slot,
    teardown_slot,
)

# ------------------------------------------------------------------------------ slots


def _lock_path(slot: int) -> Path:
    return STATE_DIR / f"slot{slot}.lock"


def state_path(slot: int) -> Path:
    return STATE_DIR / f"slot{slot}.json"


def read_state(slot: int) -> dict:
    try:
        return json.loads(state_path(slot).read_text())
    except (OSError, ValueError):
        return {}


def try_lock(slot: int) -> int | None:
    """An fd holding the slot's lock, or None when a live process holds it."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


def slot_owner(slot: int) -> str:
    """``live`` (a running process holds the lock), ``persistent`` (made by the CLI),
    ``stale`` (leftovers, no owner) or ``free``."""
    fd = try_lock(slot)
    if fd is None:
        return "live"
    try:
        if read_state(slot).get("persistent"):
            return "persistent"
        return "stale" if any(leftovers(slot).values()) else "free"
    finally:
        unlock(fd)


def remove_cluster_files(slot: int) -> None:
    """The slot's state file and the cluster directory it names (only one of ours); the ARP
    limits then fit the clusters left (the machine's own values once none is)."""
    root = read_state(slot).get("root")
    if root and Path(root).name.startswith(ROOT_PREFIX):
        shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        state_path(slot).unlink()
    sync_arp_limits()


def sweep_stale() -> list[int]:
    """Tear down every slot that has leftovers but no live owner and no persistent mark
    (a crashed earlier run); returns those slots."""
    slots = {parse_slot(n) for names in leftovers().values() for n in names} - {None}
    swept = []
    for slot in sorted(s for s in slots if s is not None):
        fd = try_lock(slot)
        if fd is None:
            continue
        try:
            if read_state(slot).get("persistent"):
                continue
            teardown_slot(slot)
            remove_cluster_files(slot)
            swept.append(slot)
        finally:
            unlock(fd)
    return swept


# ------------------------------------------------------------------------------ ARP limits

ARP_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")
ARP_KEYS = ("gc_thresh1", "gc_thresh2", "gc_thresh3")  # raised largest first, lowered last


def arp_limits_needed(cluster_sizes: Iterable[int]) -> dict[str, int]:
    """gc_thresh1/2/3 for clusters of these sizes at once: each of n hosts that all talk to
    each other (and to the control address) holds n + 1 neighbours. gc_thresh1: nothing is
    collected below it; 2 and 3: soft and hard limits, with room to spare."""
    entries = sum(n * (n + 1) for n in cluster_sizes)
    return {"gc_thresh1": entries, "gc_thresh2": 2 * entries, "gc_thresh3": 4 * entries}


def read_arp_limits(sysctl: Path = ARP_SYSCTL) -> dict[str, int]:
    return {k: int((sysctl / k).read_text()) for k in ARP_KEYS}


def _write_arp_limits(values: dict[str, int], sysctl: Path) -> None:
    now = read_arp_limits(sysctl)
    raising = [k for k in reversed(ARP_KEYS) if values[k] > now[k]]  # thresh3 first
    lowering = [k for k in ARP_KEYS if values[k] < now[k]]  # thresh1 first
    for k in raising + lowering:
        try:
            (sysctl / k).write_text(f"{values[k]}\n")
        except OSError as exc:
            raise NetnsError(f"cannot set net.ipv4.neigh.default.{k} = {values[k]}: {exc}") from exc


def sync_arp_limits(
    cluster_sizes: Sequence[int] | None = None,
    *,
    sysctl: Path = ARP_SYSCTL,
    saved: Path | None = None,
) -> dict[str, int]:
    """Fit the shared neighbour table to the clusters that exist now (default: every slot
    with a state file, live or persistent): the machine's own values, raised where those
    clusters need more. The machine's own values are saved before the first raise and
    written back, the save removed, when no cluster is left. Returns the values in force."""
    if not sysctl.is_dir():  # no IPv4 neighbour settings to fit (not Linux as we know it)
        return {}
    saved = saved or STATE_DIR / "arp-limits.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(saved.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cluster_sizes is None:
            cluster_sizes = [int(read_state(s).get("n") or 0) for s in range(MAX_SLOTS)]
        sizes = [n for n in cluster_sizes if n > 0]
        try:
            original = {k: int(v) for k, v in json.loads(saved.read_text()).items()}
        except (OSError, ValueError):
            original = None
        if not sizes:
            if original is not None:
                _write_arp_limits(original, sysctl)
                saved.unlink()
            return read_arp_limits(sysctl)
        base = original or read_arp_limits(sysctl)
        need = arp_limits_needed(sizes)
        values = {k: max(base[k], need[k]) for k in ARP_KEYS}
        if values != base and original is None:
            saved.write_text(json.dumps(base) + "\n")  # before the first change
        _write_arp_limits(values, sysctl)
        return values
    finally:
        unlock(lock)
