"""`vla-edge bringup`: the three nodes as separate processes, without launch_ros.

Starts every node of `nodes/graph.NODES` as `python -m <module> --ros-args ...`
with the parameter file (config/vla_edge.yaml by default) plus a second,
generated parameter file for overrides (`--model`, `--set key=value`), brings
each lifecycle node to active through its standard lifecycle services
(lifecycle_msgs/srv/ChangeState on /<node>/change_state: configure, then
activate), and keeps them up by their table policy (tools/supervisor.py):
a dead reconciler or camera_ingest is restarted, a dead reasoning node ends
the run with exit code 1. Ctrl-C, SIGTERM or SIGHUP stop the children one by
one, last started first, with SIGINT (SIGTERM, then SIGKILL for any that do
not exit in time).
The configuration is checked before any node starts: a bad file or value is
one line and exit code 2.

`GraphProcesses` is the same machinery as a library for the demo and tests.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from .. import config as C
from ..nodes.parent_death import PARENT_PID_ENV
from .dds_profile import use_profile
from .dds_shm import clean_before_start
from .node_processes import STOP_TIMEOUT_S, BringupError, stop_process   # noqa: F401 (BringupError: this module's API)

log = logging.getLogger(__name__)

ANSWER_WAIT_S = 5.0          # a lifecycle answer not back by then is taken as lost (see change_state)


def add_arguments(parser) -> None:
    parser.add_argument("--params", metavar="FILE", help="ROS parameter file (default: config/vla_edge.yaml)")
    parser.add_argument("--model", metavar="DIR", help="model snapshot directory (sets model.path)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override one configuration key, YAML value (repeatable), e.g. --set cycle.deadline_ms=50.0")
    parser.add_argument("--nodes", metavar="NAME[,NAME]",
                        help="start only these nodes of the table (a graph split across hosts), e.g. --nodes camera_ingest")


def run(args) -> int:
    from ..config import ConfigError, load
    from .supervisor import NodeDied, StopSignal, Supervisor

    overrides = parse_sets(args.set)
    if args.model:
        overrides["model.path"] = str(Path(args.model).resolve())
    try:
        cfg = load(args.params, overrides)          # one clean line for a bad file, before any node starts
    except ConfigError as exc:
        print(f"vla-edge bringup: {exc}", file=sys.stderr)
        return 2
    from ..nodes import graph as node_table
    try:
        nodes = None if not args.nodes else tuple(node_table.node(n.strip()) for n in args.nodes.split(","))
    except KeyError as exc:
        print(f"vla-edge bringup: --nodes: {exc.args[0]}", file=sys.stderr)
        return 2
    from ..core.engine_factory import describe_choice
    print(f"vla-edge bringup: reasoning {describe_choice(cfg.model.backend)}; reconciler "
          f"{describe_choice(cfg.asr.backend)}", flush=True)
    graph = GraphProcesses(params_file=args.params, overrides=overrides, nodes=nodes)
    supervisor = Supervisor(graph, cfg.supervisor, say=lambda text: print(f"vla-edge bringup: {text}",
                                                                          file=sys.stderr, flush=True))
    with supervisor.signals_handled():
        try:
            supervisor.start()
            print(f"vla-edge bringup: running {', '.join(graph.names())} (Ctrl-C stops)", flush=True)
            supervisor.run()
        except StopSignal:
            return 0
        except NodeDied:
            return 1                                # already reported by the supervisor
        except BringupError as exc:
            print(f"vla-edge bringup: {exc}", file=sys.stderr)
            return 1
        finally:
            codes = supervisor.stop()
            print(f"vla-edge bringup: stopped, exit codes {codes}", flush=True)
    return 0


def parse_sets(items: list) -> dict:
    """['cycle.deadline_ms=50.0', ...] -> {'cycle.deadline_ms': 50.0}; values parsed as YAML. A whole number
    given for a key whose value is a float (`--set asr.swap_poll_ms=100`) is passed as a float: ROS parameters are
    statically typed and the node would refuse an integer there."""
    float_keys = {k for k, v in C.VlaConfig().flat().items() if isinstance(v, float)}
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or "." not in key:
            raise SystemExit(f"--set expects KEY=VALUE with a dotted key such as cycle.deadline_ms=50.0, got {item!r}")
        value = yaml.safe_load(text)
        out[key] = float(value) if key in float_keys and type(value) is int else value
    return out


def overrides_params_yaml(overrides: dict) -> str:
    """Dotted overrides as a ROS parameter file applying to every node."""
    nested: dict = {}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        nested.setdefault(section, {})[name] = list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump({"/**": {"ros__parameters": nested}}, sort_keys=False)


class GraphProcesses:
    """The graph's node processes: start, bring lifecycle nodes up, watch, stop."""

    def __init__(self, params_file=None, overrides: dict | None = None, env: dict | None = None,
                 nodes: tuple | None = None, log_dir: str | os.PathLike | None = None):
        from ..config import default_config_path
        from ..nodes.graph import NODES
        self.params_file = Path(params_file) if params_file else default_config_path()
        if not self.params_file.is_file():
            raise BringupError(f"parameter file {self.params_file} not found")
        self.overrides = dict(overrides or {})
        # The Fast DDS profile (tools/dds_profile.py) for the node processes, and for this process's own participants
        # (the demo's camera and controller, the lifecycle client) when its environment is theirs: before any of them
        # is made, since Fast DDS reads the profile at a process's first participant.
        own = os.environ if env is None else dict(env)
        try:
            health_check_ms = self.config().dds.shm_health_check_ms
        except C.ConfigError:                       # the nodes refuse the file and say why; the default meanwhile
            health_check_ms = C.DdsConfig().shm_health_check_ms
        self.dds_profile = use_profile(health_check_ms, own)
        self.env = dict(own)
        self.nodes = tuple(nodes) if nodes is not None else NODES
        self.log_dir = Path(log_dir) if log_dir else None
        self.procs: dict = {}                      # node name -> Popen (the newest process of a restarted node)
        self.activation_s: dict = {}               # lifecycle node name -> seconds from configure sent to active
        self._files: list | None = None            # parameter files, written at the first start
        self._tmp = tempfile.TemporaryDirectory(prefix="vla_edge_bringup_")

    def names(self) -> list:
        return [spec.name for spec in self.nodes]

    def start(self) -> None:
        # Fast DDS files that killed or crashed processes left in /dev/shm hold memory until reboot (tools/dds_shm.py):
        # removed first, live ones kept.
        clean_before_start()
        log.info("DDS: %s", self.dds_profile.describe())
        for spec in self.nodes:
            self.spawn(spec)

    def spawn(self, spec) -> None:
        """Start (or restart) one node process. Call from the main thread: a node's parent-death
        signal (nodes/parent_death.py) follows the thread that started it."""
        if self._files is None:
            self._files = [self.params_file]
            if self.overrides:
                extra = Path(self._tmp.name) / "overrides.yaml"
                extra.write_text(overrides_params_yaml(self.overrides))
                self._files.append(extra)
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            mode = "ab" if spec.name in self.procs else "wb"                # a restart appends to the log
            out = open(self.log_dir / f"{spec.name}.log", mode)             # closed when the process is reaped
        env = {**self.env, PARENT_PID_ENV: str(os.getpid())}
        # Own session: a terminal's Ctrl-C reaches only us, and each child gets exactly one SIGINT from stop().
        self.procs[spec.name] = subprocess.Popen(spec.command(self._files), env=env, stdout=out,
                                                 stderr=subprocess.STDOUT if out else None,
                                                 start_new_session=True)
        if out is not None:
            out.close()                                                   # the child holds its own copy
        log.info("started %s (pid %d)", spec.name, self.procs[spec.name].pid)

    def activate_lifecycle_nodes(self, timeout_s: float | None = None, specs: tuple | None = None,
                                 leave_inactive: tuple = ()) -> None:
        """configure + activate every lifecycle node (of `specs`, default all) through its standard services,
        in table order (nodes named in leave_inactive are only configured); BringupError, naming the node and
        the cause, when any node process exits meanwhile. Waits lifecycle.configure_timeout_s for each
        configure and lifecycle.transition_timeout_s for each activate, from the graph's configuration
        (timeout_s, when given, bounds both)."""
        import rclpy
        from ..nodes.graph import lifecycle_service
        from lifecycle_msgs.msg import Transition
        from rclpy.signals import SignalHandlerOptions
        limits = self.config().lifecycle
        waits = {Transition.TRANSITION_CONFIGURE: limits.configure_timeout_s,
                 Transition.TRANSITION_ACTIVATE: limits.transition_timeout_s}
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=_domain_id(self.env), signal_handler_options=SignalHandlerOptions.NO)
        watched = [spec.name for spec in (self.nodes if specs is None else specs)]
        lifecycle = [spec for spec in (self.nodes if specs is None else specs) if spec.lifecycle]

        def transition(node, spec, transition_id) -> None:
            wait = waits[transition_id] if timeout_s is None else min(timeout_s, waits[transition_id])
            try:
                change_state(node, lifecycle_service(spec, "change_state"), transition_id, wait,
                             watch=lambda: self._check_alive(watched))
            except BringupError as exc:
                self._check_alive(watched)          # a node that died is the first cause
                cause = self.last_error(spec.name)  # else what the refusing node logged
                raise BringupError(f"{exc}" + (f": {cause}" if cause else "")) from None

        try:
            node = rclpy.create_node(f"vla_edge_bringup_{os.getpid()}_{threading.get_ident() % 100000}",
                                     context=context)
            t_all = time.monotonic()
            configured = set()
            if limits.parallel_configure and len(lifecycle) > 1:
                self._configure_side_by_side(context, lifecycle, lambda n, spec: transition(
                    n, spec, Transition.TRANSITION_CONFIGURE))
                configured = {spec.name for spec in lifecycle}
            for spec in lifecycle:
                t0 = t_all if spec.name in configured else time.monotonic()
                steps = (() if spec.name in configured else (Transition.TRANSITION_CONFIGURE,)) + (
                    () if spec.name in leave_inactive else (Transition.TRANSITION_ACTIVATE,))
                for transition_id in steps:
                    transition(node, spec, transition_id)
                self.activation_s[spec.name] = time.monotonic() - t0
                log.info("%s is %s (%.1f s%s)", spec.name, "inactive" if spec.name in leave_inactive else "active",
                         self.activation_s[spec.name], ", configured side by side" if configured else "")
            node.destroy_node()
        finally:
            rclpy.try_shutdown(context=context)

    @staticmethod
    def _configure_side_by_side(context, specs, configure) -> None:
        """configure(node, spec) for every spec at once, each on a thread with a client node of its own (one
        node is not spun by two executors); the first failure, in table order, is raised once all have ended."""
        import rclpy
        errors: dict = {}

        def one(spec) -> None:
            node = rclpy.create_node(f"vla_edge_bringup_{os.getpid()}_{spec.name}", context=context)
            try:
                configure(node, spec)
            except BaseException as exc:   # noqa: BLE001 - re-raised below, after the other configures ended
                errors[spec.name] = exc
            finally:
                node.destroy_node()

        threads = [threading.Thread(target=one, args=(spec,), name=f"configure-{spec.name}") for spec in specs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for spec in specs:
            if spec.name in errors:
                raise errors[spec.name]

    def config(self):
        """The graph's configuration: the parameter file with the overrides (ConfigError if invalid)."""
        from ..config import load
        return load(self.params_file, self.overrides)

    def dead(self) -> dict:
        """{name: exit code} of node processes that have exited."""
        return {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict:
        """Stop the nodes one after the other, last started first (reconciler, reasoning, camera_ingest):
        the policy stops while its camera still runs, so its last outputs are real ones and not
        stale_frame fallbacks made by the shutdown itself. Each gets SIGINT, then SIGTERM and SIGKILL
        if it does not exit in time. Returns {name: exit code}."""
        for name in reversed(self.names()):
            proc = self.procs.get(name)
            if proc is not None:
                stop_process(proc, timeout_s)
        self._tmp.cleanup()
        return {name: p.returncode for name, p in self.procs.items()}

    def last_error(self, name: str) -> str:
        """The node's last FATAL or ERROR log line (its log file), or '' (no log file, no such line)."""
        if self.log_dir is None:
            return ""
        try:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        found = [line for line in lines if line.startswith(("[FATAL]", "[ERROR]"))]
        return found[-1] if found else ""

    def _check_alive(self, names) -> None:
        for name in names:
            code = self.procs[name].poll()
            if code is not None:
                cause = self.last_error(name)
                raise BringupError(f"node {name!r} exited with code {code} during bring-up"
                                   + (f": {cause}" if cause else ""))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class _Caller:
    """Service calls spun on one executor until an overall deadline; `watch()` may raise to give up early."""

    def __init__(self, executor, deadline: float, timeout_s: float, watch=None):
        self.executor, self.deadline, self.timeout_s, self.watch = executor, deadline, timeout_s, watch

    def call(self, client, request, wait_s: float):
        """The answer, or None when none came within wait_s (the request is then given up)."""
        future = self.send(client, request)
        answer = self.wait(future, wait_s)
        if answer is None:
            client.remove_pending_request(future)
        return answer

    def send(self, client, request):
        """The request sent once the service is available: its future."""
        while not client.wait_for_service(timeout_sec=0.2):
            self._check()
            if time.monotonic() > self.deadline:
                raise BringupError(f"{client.srv_name} not available after {self.timeout_s:.0f} s")
        return client.call_async(request)

    def wait(self, future, wait_s: float):
        """The future's answer, or None when none came within wait_s (the request stays pending)."""
        until = min(self.deadline, time.monotonic() + wait_s)
        while not future.done() and time.monotonic() < until:
            self.executor.spin_until_future_complete(future, timeout_sec=0.2)
            self._check()
        return future.result() if future.done() else None

    def _check(self) -> None:
        if self.watch is not None:
            self.watch()


def change_state(node, service: str, transition_id: int, timeout_s: float, watch=None) -> None:
    """Call lifecycle_msgs/srv/ChangeState on `service` (/<node>/change_state) until the node is in the
    transition's goal state; `watch()` may raise to give up early.

    A service being "available" means the request can reach the server, not yet that its answer can
    come back (DDS matches the two directions separately), so an answer can be lost right after
    start-up. An unanswered request is therefore followed by /<node>/get_state: done if the goal
    state is reached, sent again if the node is still where it was. A node that answers neither is
    busy in the transition itself (a configure that compiles kernels and loads weights holds the node's
    executor for half a minute on a cold GPU): its request is waited for, never sent again, since the
    node would take the second one after the first and refuse it from the goal state ("Transition is
    not registered", logged as a failed callback).
    """
    from lifecycle_msgs.msg import State
    from lifecycle_msgs.srv import ChangeState, GetState
    from rclpy.executors import SingleThreadedExecutor

    goal = _goal_state(transition_id)
    base = service.rsplit("/", 1)[0]
    change = node.create_client(ChangeState, service)
    get = node.create_client(GetState, f"{base}/get_state")
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    deadline = time.monotonic() + timeout_s
    caller = _Caller(executor, deadline, timeout_s, watch)
    pending = None

    try:
        request = ChangeState.Request()
        request.transition.id = transition_id
        while time.monotonic() < deadline:
            if pending is None:
                pending = caller.send(change, request)
            answer = caller.wait(pending, ANSWER_WAIT_S)
            if answer is not None:
                pending = None
                if not answer.success:
                    raise BringupError(f"{service}: transition {transition_id} refused (see the node's log)")
                return
            state = caller.call(get, GetState.Request(), ANSWER_WAIT_S)
            current = None if state is None else state.current_state.id
            if current == goal:
                return
            if current is None or current >= State.TRANSITION_STATE_CONFIGURING:
                continue                     # busy in the transition: its answer is still to come
            log.info("%s: no answer to transition %d (state now %s); asking again", service, transition_id, current)
            change.remove_pending_request(pending)
            pending = None
        raise BringupError(f"{service}: transition {transition_id} not done after {timeout_s:.0f} s")
    finally:
        if pending is not None:
            change.remove_pending_request(pending)
        executor.remove_node(node)
        executor.shutdown()
        node.destroy_client(change)
        node.destroy_client(get)


def _goal_state(transition_id: int) -> int:
    """The primary state a transition leads to."""
    from lifecycle_msgs.msg import State, Transition
    goals = {Transition.TRANSITION_CONFIGURE: State.PRIMARY_STATE_INACTIVE,
             Transition.TRANSITION_ACTIVATE: State.PRIMARY_STATE_ACTIVE,
             Transition.TRANSITION_DEACTIVATE: State.PRIMARY_STATE_INACTIVE,
             Transition.TRANSITION_CLEANUP: State.PRIMARY_STATE_UNCONFIGURED}
    if transition_id not in goals:
        raise BringupError(f"transition {transition_id} is not one bringup drives (configure, activate, deactivate, cleanup)")
    return goals[transition_id]


def _domain_id(env: dict) -> int | None:
    value = env.get("ROS_DOMAIN_ID")
    return int(value) if value else None
