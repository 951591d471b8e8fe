"""The shared neighbour (ARP) table's limits follow the namespace clusters that exist: raised
for their hosts together, the machine's own values back once none is left (tests/support/netns/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.netns import (
    ARP_KEYS,
    MAX_SLOTS,
    NetnsCluster,
    arp_limits_needed,
    read_arp_limits,
    read_state,
    sync_arp_limits,
)

pytestmark = pytest.mark.netns
DEFAULTS = {"gc_thresh1": 128, "gc_thresh2": 512, "gc_thresh3": 1024}  # Linux's


def _sysctl(d: Path, values: dict[str, int]) -> Path:
    d.mkdir()
    for k, v in values.items():
        (d / k).write_text(f"{v}\n")
    return d


def test_limits_follow_the_clusters_and_come_back(tmp_path):
    sysctl, saved = _sysctl(tmp_path / "neigh", DEFAULTS), tmp_path / "arp-limits.json"
    # 3 hosts fit the defaults: nothing written, nothing saved
    assert sync_arp_limits([3], sysctl=sysctl, saved=saved) == DEFAULTS
    assert not saved.exists()
    # 32 hosts need 1,056 entries: more than gc_thresh3's 1,024
    assert arp_limits_needed([32])["gc_thresh1"] == 32 * 33
    big = sync_arp_limits([32], sysctl=sysctl, saved=saved)
    assert read_arp_limits(sysctl) == big == arp_limits_needed([32])
    assert big["gc_thresh3"] > DEFAULTS["gc_thresh3"]
    assert json.loads(saved.read_text()) == DEFAULTS  # the machine's own, kept
    both = sync_arp_limits([32, 3], sysctl=sysctl, saved=saved)
    assert all(both[k] > big[k] for k in ARP_KEYS)
    assert json.loads(saved.read_text()) == DEFAULTS  # not overwritten by a raised value
    # the small one left: only what the big one needs, never below the machine's own
    assert sync_arp_limits([32], sysctl=sysctl, saved=saved) == big
    assert sync_arp_limits([], sysctl=sysctl, saved=saved) == DEFAULTS
    assert read_arp_limits(sysctl) == DEFAULTS and not saved.exists()


def test_a_higher_machine_value_is_never_lowered(tmp_path):
    own = dict(DEFAULTS, gc_thresh3=100_000)
    sysctl, saved = _sysctl(tmp_path / "neigh", own), tmp_path / "arp-limits.json"
    raised = sync_arp_limits([32], sysctl=sysctl, saved=saved)
    assert raised["gc_thresh3"] == 100_000 and raised["gc_thresh1"] == 32 * 33
    assert sync_arp_limits([], sysctl=sysctl, saved=saved) == own


def _sizes() -> list[int]:
    return [int(read_state(s).get("n") or 0) for s in range(MAX_SLOTS)]


def test_a_real_cluster_raises_the_limits_and_its_close_restores_them(netns: NetnsCluster):
    before, sizes_before = read_arp_limits(), _sizes()
    n = 18  # with the session's 3-host cluster: 18*19 + 3*4 = 354 entries, 1,416 > 1,024
    with NetnsCluster(n) as big:
        now = read_arp_limits()
        need = arp_limits_needed([x for x in _sizes() if x])
        assert all(now[k] >= need[k] for k in ARP_KEYS), (now, need)
        assert now["gc_thresh3"] >= 4 * (n * (n + 1))
        # and the hosts do reach each other through the raised table
        dial = f"import socket; socket.create_connection(({big.hosts[-1].address!r}, 22), 5)"
        assert big.exec(1, [sys.executable, "-S", "-c", dial + "; print('ok')"]) == "ok\n"
    if _sizes() == sizes_before:  # no other cluster came or went meanwhile
        assert read_arp_limits() == before
