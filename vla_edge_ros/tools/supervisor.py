"""Keeps the graph's node processes up, by the policy of their row in nodes/graph.NODES.

In the spirit of launch's `respawn` and nav2's lifecycle manager, for `vla-edge
bringup` and `vla-edge demo`:

    start    every node of the table as its own process (tools/bringup.GraphProcesses);
             every lifecycle node brought to active (configure, activate)
    poll     a node that exited is
               - restarted if its row says `respawn`: after restart_backoff_s, doubled after
                 each restart that did not stay up restart_stable_s (at most
                 restart_backoff_max_s), and a lifecycle node is brought back to active on a
                 helper thread, so the watch goes on meanwhile; one whose configure or
                 activate fails is stopped and tried again later;
               - otherwise reported at once: `NodeDied` (the run ends non-zero)
    stop     the nodes one by one, last started first (GraphProcesses.stop), waiting for each
    signals  SIGINT, SIGTERM and SIGHUP raise `StopSignal` in the main thread once, so the
             caller's `finally` stops the nodes; a second signal while stopping is ignored
             (the escalation to SIGKILL bounds the stop anyway). If this process is killed
             outright, the nodes stop by themselves (nodes/parent_death.py).

Processes are started only from the thread that calls `start` / `poll` (the main thread): a
node's parent-death signal follows the thread that forked it.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .node_processes import BringupError, stop_process

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_PERIOD_S = 0.1


class StopSignal(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached the supervisor: stop the nodes and exit."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class NodeDied(BringupError):
    """A node whose table row does not say `respawn` exited while the graph ran."""

    def __init__(self, name: str, code: int, cause: str = ""):
        super().__init__(f"node {name!r} exited with code {code}" + (f": {cause}" if cause else ""))
        self.name, self.code, self.cause = name, code, cause
        self.at_monotonic = time.monotonic()


@dataclass
class _Watch:
    """Restart bookkeeping of one node."""
    started_s: float                       # monotonic start of its current process
    quick_failures: int = 0                # deaths in a row that came before restart_stable_s
    restart_due_s: float | None = None     # dead, waiting for its backoff
    activating: threading.Thread | None = None
    activation_error: str = ""             # set by the activation thread, handled by poll()
    restarts: int = 0


class Supervisor:
    def __init__(self, procs, cfg, say=None):
        """procs: GraphProcesses; cfg: config.SupervisorConfig; say(text): the operator's channel."""
        self.procs = procs
        self.cfg = cfg
        self.say = say or (lambda text: log.warning("%s", text))
        self.specs = {spec.name: spec for spec in procs.nodes}
        self.watches: dict = {}
        self.events: list = []             # (monotonic s, text) of every death and restart
        self._stopping = False
        self._signalled = False
        self.leave_inactive: tuple = ()

    # ------------------------------------------------------------------ public

    def start(self, lifecycle_timeout_s: float | None = None, leave_inactive: tuple = ()) -> None:
        """All nodes started and lifecycle nodes active (those in leave_inactive only configured, also after
        a restart); BringupError (with the cause) otherwise."""
        now = time.monotonic()
        self.leave_inactive = tuple(leave_inactive)
        self.procs.start()
        self.watches = {name: _Watch(started_s=now) for name in self.specs}
        kwargs = {} if lifecycle_timeout_s is None else {"timeout_s": lifecycle_timeout_s}
        self.procs.activate_lifecycle_nodes(leave_inactive=self.leave_inactive, **kwargs)

    def poll(self) -> None:
        """Handle deaths, due restarts and finished activations; NodeDied for a node without respawn."""
        now = time.monotonic()
        for name, spec in self.specs.items():
            watch = self.watches.get(name)
            proc = self.procs.procs.get(name)
            if watch is None or proc is None or self._stopping:
                continue
            if watch.restart_due_s is not None:
                if now >= watch.restart_due_s:
                    self._restart(spec, watch, now)
                continue
            if watch.activation_error and watch.activating is not None and not watch.activating.is_alive():
                if proc.poll() is None:
                    self._note(f"{name} did not come back to active ({watch.activation_error}); stopping it")
                    stop_process(proc, self.cfg.stop_timeout_s)
                watch.activation_error = ""
            code = proc.poll()
            if code is None:
                continue
            cause = self.procs.last_error(name)
            if not spec.respawn:
                self._note(f"node {name!r} exited with code {code}" + (f": {cause}" if cause else ""))
                raise NodeDied(name, code, cause)
            ran_s = now - watch.started_s
            watch.quick_failures = 1 if ran_s >= self.cfg.restart_stable_s else watch.quick_failures + 1
            delay = min(self.cfg.restart_backoff_max_s, self.cfg.restart_backoff_s * 2 ** (watch.quick_failures - 1))
            watch.restart_due_s = now + delay
            self._note(f"{name} exited with code {code} after {ran_s:.1f} s; restarting it in {delay:.1f} s")

    def run(self, seconds: float | None = None) -> None:
        """poll() until `seconds` have passed (None: until a signal or a NodeDied)."""
        end = None if seconds is None else time.monotonic() + seconds
        while end is None or time.monotonic() < end:
            self.poll()
            time.sleep(POLL_PERIOD_S if end is None else max(0.0, min(POLL_PERIOD_S, end - time.monotonic())))

    def stop(self) -> dict:
        """Stop every node, last started first, and wait; {name: exit code}."""
        self._stopping = True
        codes = self.procs.stop(self.cfg.stop_timeout_s)
        for watch in self.watches.values():
            if watch.activating is not None:
                watch.activating.join(timeout=self.cfg.stop_timeout_s)     # ends once its process is gone
        return codes

    def restarts(self) -> dict:
        return {name: w.restarts for name, w in self.watches.items()}

    @contextmanager
    def signals_handled(self):
        """SIGINT / SIGTERM / SIGHUP -> StopSignal, once (main thread only)."""
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # ------------------------------------------------------------- internals

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self._stopping or self._signalled:
            log.warning("%s while stopping: the nodes are already being stopped", name)
            return
        self._signalled = True
        self._note(f"{name}: stopping the nodes")
        raise StopSignal(signum)

    def _restart(self, spec, watch: _Watch, now: float) -> None:
        watch.restart_due_s = None
        watch.restarts += 1
        watch.started_s = now
        self.procs.spawn(spec)
        self._note(f"{spec.name} restarted (restart {watch.restarts}, pid {self.procs.procs[spec.name].pid})")
        if spec.lifecycle:
            watch.activation_error = ""
            watch.activating = threading.Thread(target=self._activate, args=(spec, watch),
                                                name=f"activate-{spec.name}", daemon=True)
            watch.activating.start()

    def _activate(self, spec, watch: _Watch) -> None:
        try:
            self.procs.activate_lifecycle_nodes(specs=(spec,), leave_inactive=self.leave_inactive)
        except BringupError as exc:
            if not self._stopping:
                watch.activation_error = str(exc)
            return
        self._note(f"{spec.name} is active again")

    def _note(self, text: str) -> None:
        self.events.append((time.monotonic(), text))
        self.say(text)
