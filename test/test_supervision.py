"""Failures an operator can see and survive (issue 11): `vla-edge bringup` and `vla-edge demo` as a
user runs them, real node processes over DDS, signals and kills from outside.

    no node outlives its supervisor (SIGTERM, SIGHUP: stopped in order; SIGKILL: the nodes notice)
    a killed reconciler is restarted and brought back to active while reasoning keeps serving
    a failed bring-up names the cause and leaves no node behind
    a dead reasoning node ends the demo at once, non-zero, with its missing cycles counted as lost
    a mistyped model path is an error, not a new random model
    a bad configuration is one line and exit code 2, before any node starts
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState

import ros_helpers as H
from vla_edge_ros.config import default_config_path
from vla_edge_ros.core.swap_protocol import SHM_DIR
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens

pytestmark = pytest.mark.ros
CLI = [sys.executable, "-m", "vla_edge_ros.cli"]
CPU_DEMO = default_config_path().parent / "cpu_demo.yaml"


class Output:
    """A child's merged stdout/stderr, read line by line on a thread."""

    def __init__(self, proc):
        self.lines: list = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout_s: float, proc=None) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.text():
            if proc is not None and proc.poll() is not None:
                time.sleep(0.2)
                if needle in self.text():
                    return
                raise AssertionError(f"exited with {proc.returncode} before {needle!r}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} within {timeout_s:.0f} s:\n{self.text()[-3000:]}")
            time.sleep(0.05)


def _start(argv: list, env: dict):
    proc = subprocess.Popen(CLI + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, Output(proc)


def _kill_leftovers(marker: str) -> list:
    """SIGKILL whatever of this run is still alive (so a failing test leaves nothing); returns the pids."""
    left = H.marked_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# ----------------------------------------------------------------------------
# bringup


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_no_node_outlives_bringup(tiny_model_dir, sig):
    env, marker = H.marked_env(H.ros_domain(__name__))
    proc, out = _start(["bringup", "--model", str(tiny_model_dir)], env)
    try:
        out.wait_for("Ctrl-C stops", H.GRAPH_START_TIMEOUT_S, proc)
        nodes = [pid for pid in H.marked_processes(marker) if pid != proc.pid]
        assert len(nodes) == 3, (nodes, H.child_pids(proc.pid))
        proc.send_signal(sig)
        proc.wait(timeout=60)
        H.wait_until(lambda: not any(H.pid_alive(pid) for pid in nodes), 15.0,
                     f"the node processes {nodes} to exit after {sig.name} to bringup")
    finally:
        if proc.poll() is None:
            proc.kill()
        left = _kill_leftovers(marker)
    assert not left
    if sig != signal.SIGKILL:
        text = out.text()
        assert proc.returncode == 0, text
        assert f"{sig.name}: stopping the nodes" in text
        assert "stopped, exit codes {'camera_ingest': 0, 'reasoning': 0, 'reconciler': 0}" in text, text


def test_bringup_restarts_a_killed_reconciler_while_reasoning_serves(tiny_model_dir):
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
    fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
    env, marker = H.marked_env(domain)
    # Room for 12 frames: the reconciler has work (and a snapshot directory) within a second.
    proc, out = _start(["bringup", "--model", str(tiny_model_dir), "--set", "kv.capacity_tokens=480",
                        "--set", f"cycle.deadline_ms={H.PLUMBING_DEADLINE_MS}"], env)
    camera = H.CameraPublisher(harness, H.footage_rgb(120))
    try:
        out.wait_for("Ctrl-C stops", H.GRAPH_START_TIMEOUT_S, proc)
        # Both outcome topics matched before any action: a cycle published before its topic matched is lost, and
        # the gap check below would blame the graph (a CI run lost six fallbacks this way).
        H.wait_matched(tokens, fallbacks)
        camera.start()
        H.wait_until(lambda: len(tokens) > 30, H.GRAPH_START_TIMEOUT_S, "30 actions")
        old = H.node_pid(proc.pid, "reconciler")
        left_behind = list(Path(SHM_DIR).glob(f"vla_edge_swap_{old}_*"))
        assert left_behind, "the reconciler has no snapshot directory"
        os.kill(old, signal.SIGKILL)
        out.wait_for("reconciler is active again", H.GRAPH_START_TIMEOUT_S, proc)
        new = H.node_pid(proc.pid, "reconciler")
        assert new not in (None, old)
        state = H.call_service(harness, GetState, "/reconciler/get_state", GetState.Request())
        assert state.current_state.id == State.PRIMARY_STATE_ACTIVE
        # The killed one could not delete its snapshots; the new one removed them at configure.
        assert not any(d.exists() for d in left_behind), left_behind
        served = len(tokens)
        H.wait_until(lambda: len(tokens) > served + 30, 15.0, "actions after the restart")
        assert proc.poll() is None, out.text()[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        camera.stop()
        if proc.poll() is None:
            proc.kill()
        _kill_leftovers(marker)
        harness.close()
    text = out.text()
    assert proc.returncode == 0, text
    assert "reconciler exited with code -9" in text and "reconciler restarted (restart 1" in text, text
    H.assert_no_gaps(H.cycle_outputs(tokens, fallbacks))


def test_bringup_checks_the_configuration_before_starting_anything(tmp_path):
    env, marker = H.marked_env(H.ros_domain(__name__))
    broken = tmp_path / "broken.yaml"
    broken.write_text("/**:\n  ros__parameters:\n    cycle: {deadline_ms: 33.0\n")    # unclosed flow mapping
    cases = [(["--params", str(broken)], "cannot read configuration"),
             (["--set", "cycle.safety_margin_ms=40.0"], "must be smaller than cycle.deadline_ms"),
             (["--set", "cycle.deadline_s=40.0"], "unknown configuration key 'cycle.deadline_s'")]
    for argv, needle in cases:
        done = subprocess.run(CLI + ["bringup"] + argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr)
        assert needle in done.stderr and done.stderr.startswith("vla-edge bringup: "), done.stderr
    assert not H.marked_processes(marker), "a node was started for a configuration that was refused"


# ----------------------------------------------------------------------------
# demo


def test_demo_with_a_broken_model_names_the_cause_and_leaves_no_node(tiny_model_dir, tmp_path):
    model = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, model)
    with open(model / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    env, marker = H.marked_env(H.ros_domain(__name__))
    env["VLA_EDGE_LOG_DIR"] = str(tmp_path / "logs")
    try:
        done = subprocess.run(CLI + ["demo", "--seconds", "5", "--params", str(CPU_DEMO), "--model", str(model)],
                              env=env, capture_output=True, text=True, timeout=180)
        time.sleep(0.5)
        left = H.marked_processes(marker)
    finally:
        _kill_leftovers(marker)
    assert not left, f"node processes outlived the demo: {left}"
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr
    # The real cause, from the node's log, on the demo's own output.
    assert "truncated or corrupt safetensors file" in done.stderr, done.stderr


def test_demo_ends_at_once_when_reasoning_dies_and_counts_the_lost_cycles(tiny_model_dir, tmp_path):
    seconds = 8.0
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)      # listening beside the demo
    env, marker = H.marked_env(domain)
    env["VLA_EDGE_LOG_DIR"] = str(tmp_path / "logs")
    report_path = tmp_path / "demo.json"
    proc, out = _start(["demo", "--seconds", str(seconds), "--params", str(CPU_DEMO), "--model", str(tiny_model_dir),
                        "--json", str(report_path)], env)
    try:
        # The demo's window opens at the first action; kill the policy about 2 s into it. Timed from the demo's own
        # "measuring" line, printed as the window opens: an action seen by the listener beside it can come seconds
        # later (its DDS discovery; CI, 2026-12-04: 130 cycles counted before the kill where ~60 were meant).
        out.wait_for("measuring", H.GRAPH_START_TIMEOUT_S + 30, proc)
        t_open = time.monotonic()
        H.wait_until(lambda: len(tokens) > 0 or proc.poll() is not None, 30, "an action beside the demo")
        time.sleep(max(0.0, t_open + 2.0 - time.monotonic()))
        t_kill = time.monotonic()
        os.kill(H.node_pid(proc.pid, "reasoning"), signal.SIGKILL)
        proc.wait(timeout=60)
        t_end = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_leftovers(marker)
        harness.close()
    text = out.text()
    assert proc.returncode == 1, text[-3000:]
    assert t_end - t_kill < seconds - 2.0, "the demo waited out its window with the policy dead"
    assert "node 'reasoning' exited with code -9" in text, text[-3000:]
    report = json.loads(report_path.read_text())
    assert "reasoning" in report["ended_early"]
    # About 2 s of cycles came; the other ~6 s (~180 cycles at 30 Hz) never did and must count as lost.
    assert report["cycles"] < 0.5 * seconds * 30, report["cycles"]
    assert report["lost_cycles"] >= 0.5 * (seconds - 2.0) * 30, report
    assert report["expected_cycles"] == report["cycles"] + report["lost_cycles"]
    assert report["deadline_miss_rate"] >= report["lost_cycles"] / report["expected_cycles"]
    assert "lost (never published)" in text and "ENDED EARLY" in text


def test_demo_refuses_a_model_path_that_does_not_exist(tmp_path):
    typo = tmp_path / "modles" / "tiny"
    done = subprocess.run(CLI + ["demo", "--seconds", "1", "--model", str(typo)], env=H.graph_env(1),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"no model in {typo}" in done.stderr, done.stderr
    assert not typo.exists() and not typo.parent.exists(), "the demo wrote a model at the mistyped path"
