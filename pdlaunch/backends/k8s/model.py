"""The Kubernetes export's vocabulary (.manifests): what it builds, the names and
labels it gives objects, and the tokens of a container's argv that Kubernetes fills in."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdlaunch.plan.build import ProcessRole
from pdlaunch.spec import facts

Target = Literal["disaggregatedset", "lws"]
TARGETS: tuple[Target, ...] = ("disaggregatedset", "lws")
Manifest = dict[str, Any]
ImageChoice = str | Mapping[str, str] | None

# kubernetes-sigs/lws v0.10.0 (docs/k8s-export.md): api/disaggregatedset/v1/
# groupversion_info.go and api/leaderworkerset/v1/groupversion_info.go.
DS_API_VERSION = "disaggregatedset.x-k8s.io/v1"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# api/leaderworkerset/v1/leaderworkerset_types.go: the label every LWS pod carries ("0" on the
# leader), and variables pkg/utils/pod/pod_utils.go (AddLWSVariables) puts in every container.
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"

# Names of derived objects must stay within 63 characters: a DisaggregatedSet names its
# LeaderWorkerSets <name>-<slice>-<8-hex revision>-<role> (lws pkg/utils/disaggregatedset/
# utils.go), LWS names the worker StatefulSet of group g <lws>-<g>, and the StatefulSet
# controller labels pods <statefulset>-<10-char hash>.
MAX_NAME = 28


class ExportError(Exception):
    """A plan, topology or option the export cannot turn into manifests; the message says
    what to change. Nothing is written when it is raised."""


@dataclass(frozen=True)
class EnvRef:
    """A variable the pod has when it starts (downward API, or injected by LWS)."""

    name: str


@dataclass(frozen=True)
class WorkerRank:
    """A worker node's `--data-parallel-start-rank`: LWS_WORKER_INDEX x DP ranks per node,
    the plan's `node_index x local DP size` (ports.nodes_of) with LWS's index for the node's."""

    per_node: int


@dataclass(frozen=True)
class PodDns:
    """A pod's stable DNS name, ``<pod>.<service>.<namespace>.svc.<cluster domain>``: what a
    StatefulSet pod gets from its headless Service (the pod's hostname and subdomain), the
    namespace filled in from the downward API where the container starts."""

    pod: str
    service: str


# Kubernetes' default cluster domain (the kubelet's --cluster-domain; kubeadm's default).
CLUSTER_DOMAIN = "cluster.local"

Token = str | EnvRef | WorkerRank | PodDns


@dataclass(frozen=True)
class RoleTemplate:
    role: ProcessRole
    instances: tuple[str, ...]
    size: int  # pods per instance: the leader and size - 1 workers
    leader: Manifest  # pod template
    worker: Manifest | None  # None when size == 1
    # Some nodes run headless (no HTTP): the router must pick leader pods only.
    leaders_only: bool

    @property
    def replicas(self) -> int:
        return len(self.instances)


@dataclass(frozen=True)
class Export:
    name: str
    target: Target
    objects: list[Manifest]
    # The Secret the pods read their secret variables from (keys: the `${env:NAME}` names);
    # None when the plan has no secrets. pdlaunch never writes its values.
    secret: str | None
    secret_keys: tuple[str, ...]
    # What differs from the plan and why (also written to index.md).
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Context:
    name: str
    vllm: dict[str, facts.Facts]  # per process name: the facts of the release it runs
    # The one HTTP port of every engine pod (vllm-router discovers one port); None: each
    # keeps its planned port (a fixed-list proxy is given each one).
    http_port: int | None
    secret: str


def k8s_name(deployment: str) -> str:
    """The deployment name as a Kubernetes name (DNS-1035 label) all derived names fit."""
    name = re.sub(r"[^a-z0-9-]+", "-", deployment.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"pd-{name}".rstrip("-")
    if name == deployment and len(name) <= MAX_NAME:
        return name
    # A changed or shortened name keeps a digest of the original, so two deployments that
    # differ only in case or punctuation stay apart.
    digest = hashlib.sha256(deployment.encode()).hexdigest()[:5]
    return f"{name[: MAX_NAME - 6].rstrip('-')}-{digest}"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "pdlaunch",
    }


def selector(name: str, role: RoleTemplate) -> dict[str, str]:
    """The pod labels that pick the pods of `role` serving HTTP (vllm-router matches every
    key, src/service_discovery.rs PodInfo::matches_selector)."""
    out = {k: v for k, v in labels(name, role.role).items() if k != "app.kubernetes.io/managed-by"}
    if role.leaders_only:
        out[WORKER_INDEX_LABEL] = "0"
    return out
