"""The batch protocol `pdlaunch check` runs each host's probes through (pdlaunch.check.batch):
one script per host, each job framed, timed out and parsed on its own; and the batched
reachability snippet, which must say what the single-target one says."""

from __future__ import annotations

import json
import socket
import sys

from pdlaunch.check.batch import Job, batch_script, parse_batch, run_jobs
from pdlaunch.check.probes import CommandOutput
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.hosts import LocalHost
from tests.support.sshd import free_port


def test_batch_framing_timeouts_and_odd_output():
    host = LocalHost("127.0.0.1")
    seen: dict[str, CommandOutput] = {}

    def keep(name):
        def ev(out: CommandOutput):
            seen[name] = out
            return [CheckResult(name, "h", Status.OK, "")]

        return ev

    jobs = [
        Job("printf 'no newline'; printf 'e1\\ne2\\n' >&2; exit 3", 5, keep("a"), "a"),
        Job("true", 5, keep("empty"), "empty"),
        Job("printf '\\n\\nx\\n\\n'", 5, keep("blank"), "blank"),
        Job("exit 127", 5, keep("missing"), "missing"),
        Job("sleep 10", 1, keep("slow"), "slow"),
    ]
    res = run_jobs(host, jobs, "h")
    assert seen["a"] == CommandOutput(3, "no newline", "e1\ne2\n")
    assert seen["empty"] == CommandOutput(0, "", "")
    assert seen["blank"].stdout == "\n\nx\n\n"
    assert seen["missing"].rc == 127
    slow = next(r for r in res if r.probe == "slow")
    assert slow.status is Status.FAIL and "timed out after 1s" in slow.message
    assert "slow" not in seen


def test_parse_batch_ignores_missing_jobs():
    b = "@@B"
    script = batch_script([Job("echo hi", 5, lambda o: [], "x")], b)
    assert "wait" in script and "timeout -k 2 5" in script
    text = f"{b} 0 out\nhi\n\n{b} 0 err\n\n{b} 0 rc 0\n{b} 1 out\npartial"
    assert parse_batch(text, b, 2) == {0: CommandOutput(0, "hi\n", "")}


def test_reach_batch_prints_what_the_single_reach_probe_prints():
    """The batched reachability snippet (one interpreter per source host) gives, per target,
    the same JSON line as ports.REACH_SNIPPET, so ports.eval_port_reach judges both."""
    import subprocess

    from pdlaunch.check.probes.ports import REACH_BATCH_SNIPPET, REACH_SNIPPET

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        targets = [
            ("127.0.0.1", srv.getsockname()[1]),
            ("127.0.0.1", free_port()),
            ("no-such-host.invalid", 8000),
        ]
        batch = subprocess.run(
            [sys.executable, "-c", REACH_BATCH_SNIPPET, "3", json.dumps(targets)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        single = [
            subprocess.run(
                [sys.executable, "-c", REACH_SNIPPET, h, str(p), "3"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            for h, p in targets
        ]
    assert [json.loads(x) for x in batch] == [json.loads(x) for x in single]
    assert [json.loads(x)["result"] for x in batch] == ["open", "refused", "error"]
