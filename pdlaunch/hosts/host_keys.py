"""SSH host keys: which known_hosts files a connection trusts (parsed once while they do not
change), the policy for a key none of them has (refuse, or with ``accept_new`` trust it and
record it), and OpenSSH-style fingerprints for the messages."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import threading
from pathlib import Path

import paramiko

log = logging.getLogger("pdlaunch.hosts")

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
_KNOWN_HOSTS_LOCK = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def display_name(known_hosts_name: str) -> str:
    """``[1.2.3.4]:2222`` -> ``1.2.3.4:2222``."""
    if known_hosts_name.startswith("["):
        host, _, port = known_hosts_name[1:].partition("]:")
        return f"{host}:{port}"
    return known_hosts_name


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (accept_new) trust them and append them to ``record_to``."""

    def __init__(self, accept_new: bool, record_to: Path):
        self.accept_new = accept_new
        self.record_to = record_to

    def missing_host_key(self, client, hostname, key):
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        _record_host_key(self.record_to, hostname, key)
        log.warning(
            "trusting new host key for %s (%s %s), recorded in %s",
            display_name(hostname),
            key.get_name(),
            fingerprint(key),
            self.record_to,
        )


def _record_host_key(path: Path, hostname: str, key: paramiko.PKey) -> None:
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with _KNOWN_HOSTS_LOCK:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            existing = path.read_text()
        except FileNotFoundError:
            existing = ""
        if line in existing:
            return
        with open(path, "a") as f:
            if existing and not existing.endswith("\n"):
                f.write("\n")
            f.write(line)


_HOST_KEYS: dict[tuple[str, ...], tuple[tuple, paramiko.HostKeys]] = {}
_HOST_KEYS_LOCK = threading.Lock()


def known_host_keys(files: list[str]) -> paramiko.HostKeys:
    """The keys of these known_hosts files (missing ones skipped), parsed once while none of
    them changes. paramiko's load checks each line against every line before it, and every
    host of a run reads the same files: with a known_hosts of 2 lines per host, parsing it
    per connection made a run's CPU grow with the cube of its hosts (~25 ms per connection
    at 128 hosts)."""
    paths = tuple(dict.fromkeys(p for p in files if os.path.isfile(p)))

    def stamp(path: str) -> tuple:
        try:
            st = os.stat(path)
        except OSError:
            return (path,)
        return (path, st.st_ino, st.st_size, st.st_mtime_ns)

    stamps = tuple(stamp(p) for p in paths)
    with _HOST_KEYS_LOCK:
        cached = _HOST_KEYS.get(paths)
        if cached is not None and cached[0] == stamps:
            return cached[1]
        keys = paramiko.HostKeys()
        for path in paths:
            try:
                keys.load(path)
            except (OSError, paramiko.SSHException) as e:
                log.warning("ignoring unreadable known_hosts file %s: %s", path, e)
        _HOST_KEYS[paths] = (stamps, keys)
        return keys


def split_paths(value) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        value = shlex.split(value)
    return [os.path.expanduser(v) for v in value if v and v.lower() != "none"]


