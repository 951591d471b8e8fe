"""Host and bind addresses: the one place that decides what "this machine", "the same
machine" and "the same listening address" mean. Pure functions, standard library only (the
hosts layer and the rules both import it).

Definitions:

* **loopback** (`is_loopback`): 127.0.0.0/8, ::1 or `localhost`, in any spelling. Every such
  address is served by the machine that dials it.
* **local control host** (`is_local_control_host`): 127.0.0.1, ::1 or `localhost`: the
  spellings pdlaunch runs without SSH by default (README, `hosts.<h>.local`). Other loopback
  addresses (127.0.0.2, ...) are reached over SSH unless `local: true` says otherwise: the
  tests and benchmarks run one sshd per such address as a stand-in for another host.
* **same machine** (`same_machine`): equal `host_key`s: every loopback spelling is one
  machine, other names compare case-insensitively without a trailing dot. Only questions
  about one machine's resources (ports, cores, devices) use it.
* **same address** (`same_address`): one address in two spellings (case, trailing dot, IPv6
  compression, legacy IPv4 forms such as 127.1). What the `hosts:` settings of a topology are
  keyed by: settings (SSH port, key, `local`) written for 127.0.0.30 are not those of a
  router on 127.0.0.1, though both are this machine.
* **overlapping binds** (`binds_overlap`): the same address, or either is a wildcard
  (0.0.0.0 / ::); a name pdlaunch cannot resolve without DNS is assumed to overlap.
* **port clash** (`listeners_clash`): two listeners on one port clash only if they are on the
  same machine AND their binds overlap (Linux refuses the second bind(2) exactly then; a
  prefill side channel on 127.0.0.2:5600 and a decode one on 127.0.0.1:5600 coexist).
"""

from __future__ import annotations

import socket
from functools import lru_cache
from ipaddress import ip_address

# The pure functions below are cached: the rules and the plan ask about the same few hundred
# hosts tens of thousands of times on a large topology (benchmarks/bench_spine.py).

#: The spellings (after `canonical_host`) that mean "this machine, no SSH".
LOCAL_ADDRESSES = frozenset({"127.0.0.1", "localhost", "::1"})


def _ipv4_legacy(host: str) -> bytes | None:
    """The address the C resolver gives an IPv4 spelling `ipaddress` refuses ("0", "127.1",
    "0x7f.1", "000.000.000.000"): what a socket would really connect to or bind."""
    try:
        return socket.inet_aton(host)
    except (OSError, ValueError):
        return None


def is_ip_literal(host: str) -> bool:
    """An address, not a name: what a socket binds or dials without asking a resolver (a name
    may resolve differently on the node that binds and the one that dials)."""
    try:
        ip_address(host.split("%", 1)[0])
    except ValueError:
        return _ipv4_legacy(host) is not None
    return True


@lru_cache(maxsize=4096)
def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: one machine, whatever the spelling."""
    if host.strip().rstrip(".").lower() == "localhost":
        return True
    try:
        return ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        legacy = _ipv4_legacy(host.strip())
        return legacy is not None and legacy[0] == 127


@lru_cache(maxsize=4096)
def canonical_host(host: str) -> str:
    """One spelling per host: DNS names are case-insensitive and a trailing dot names the
    same host; an IPv6 address has one compressed form."""
    host = host.strip().rstrip(".").lower()
    try:
        return str(ip_address(host.strip("[]")))
    except ValueError:
        return host


@lru_cache(maxsize=4096)
def _address(host: str) -> str:
    """`canonical_host`, with legacy IPv4 spellings ("127.1") as the dotted quad they mean."""
    canonical = canonical_host(host)
    legacy = None if ":" in canonical else _ipv4_legacy(canonical)
    return socket.inet_ntoa(legacy) if legacy is not None else canonical


@lru_cache(maxsize=4096)
def host_key(host: str) -> str:
    """Where "same machine" is decided: every loopback spelling is one machine."""
    return "localhost" if is_loopback(host) else canonical_host(host)


def same_machine(a: str, b: str) -> bool:
    return host_key(a) == host_key(b)


def address_key(host: str) -> str:
    """Where "same address" is decided (`hosts:` settings): loopback addresses stay apart."""
    return _address(host)


def same_address(a: str, b: str) -> bool:
    return address_key(a) == address_key(b)


@lru_cache(maxsize=4096)
def is_unspecified(host: str) -> bool:
    """0.0.0.0 / :: (in any spelling: "0", "0x0") mean "every address" to bind(); nobody can
    dial them."""
    try:
        return ip_address(host.strip().strip("[]")).is_unspecified
    except ValueError:
        return _ipv4_legacy(host.strip()) == b"\0\0\0\0"


def is_local_control_host(host: str) -> bool:
    """True for the addresses that mean "this machine, no SSH" (127.0.0.1, localhost, ::1)."""
    return _address(host) in LOCAL_ADDRESSES


@lru_cache(maxsize=4096)
def _bind_ips(bind: str) -> frozenset[str] | None:
    """The addresses a bind to `bind` may take; None for a name only DNS could answer."""
    address = _address(bind)
    if address == "localhost":
        # getaddrinfo("localhost") gives 127.0.0.1, ::1 or both, depending on /etc/hosts.
        return frozenset({"127.0.0.1", "::1"})
    try:
        return frozenset({str(ip_address(address))})
    except ValueError:
        return None


def binds_overlap(a: str, b: str) -> bool:
    """Whether listeners bound to `a` and `b` on one machine compete for the same port."""
    if is_unspecified(a) or is_unspecified(b):
        return True
    ips_a, ips_b = _bind_ips(a), _bind_ips(b)
    if ips_a is None or ips_b is None:
        # A DNS name may resolve to the other address: assuming a clash is the safe side (the
        # user can always pick another port).
        return True
    return bool(ips_a & ips_b)


def listeners_clash(host_a: str, bind_a: str, host_b: str, bind_b: str) -> bool:
    """Two listeners on one port clash iff on the same machine with overlapping binds."""
    return same_machine(host_a, host_b) and binds_overlap(bind_a, bind_b)
