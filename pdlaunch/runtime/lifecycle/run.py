"""One `up` under way, as the lifecycle's steps share it: the runtime's Launch, the plan, the
live view of every process (what the Reporter shows) and the deadline."""

from __future__ import annotations

from pdlaunch.plan.build import Process
from pdlaunch.runtime.base import Launch

from .model import Failure, Reporter, UpOptions, View


class Run:
    """One `up` under way: the runtime's Launch, the live view and the deadline."""

    def __init__(self, launch: Launch, reporter: Reporter, opts: UpOptions, deadline: float):
        self.launch = launch
        self.plan = launch.plan
        self.reporter = reporter
        self.opts = opts
        self.deadline = deadline
        self.provisioned = False
        self.views = {p.name: View(p.name, p.role, p.host) for p in self.plan.processes}
        for name in launch.adopted:
            self.set(name, "starting", "already running (adopted)")
        reporter.views(list(self.views.values()))

    def set(self, name: str, state: str, detail: str = "", pid: int | None = None) -> None:
        v = self.views[name]
        if pid is not None:  # first: a reporter thread that sees the new detail sees the pid
            v.pid = pid
        v.state, v.detail = state, detail
        self.reporter.update()

    def failure(self, p: Process, reason: str) -> Failure:
        return Failure(p.name, self.launch.where(p), reason, p.log_path, self.launch.log_tail(p))
