"""Capture PyCUDA launches on a stream into a CUDA graph and replay it (cuda.bindings.driver).

PyCUDA launches go through the driver API on the stream we hand it, so a
capture begun with `cuStreamBeginCapture` on that stream's handle records
them; replaying the instantiated graph costs one host call instead of ~7-9 us
per kernel. Everything a captured kernel must see change between replays has
to live in device memory (the control block, the slot tables): kernel
arguments are frozen at capture time.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class GraphError(RuntimeError):
    """A CUDA graph could not be captured, instantiated or launched (names the step and the driver error)."""


def _driver():
    from cuda.bindings import driver
    return driver


def _ok(result, what: str, error: type = GraphError):
    """cuda.bindings returns (CUresult, *values); raise `error` on a failure (naming the call and the driver
    error), return the values. cuda_pdl.py uses it too, with its own error type."""
    drv = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        name = drv.cuGetErrorName(err)[1]
        raise error(f"{what} failed: {name.decode() if isinstance(name, bytes) else name} ({int(err)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


class CapturedGraph:
    """An instantiated graph; `launch(stream)` replays it on a PyCUDA stream."""

    def __init__(self, name: str, graph, graph_exec, n_nodes: int):
        self.name = name
        self._graph = graph
        self._exec = graph_exec
        self.n_nodes = n_nodes

    def launch(self, stream) -> None:
        drv = _driver()
        _ok(drv.cuGraphLaunch(self._exec, drv.CUstream(stream.handle)), f"cuGraphLaunch({self.name})")

    def close(self) -> None:
        drv = _driver()
        if self._exec is not None:
            drv.cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            drv.cuGraphDestroy(self._graph)
            self._graph = None


def capture(name: str, stream, record) -> CapturedGraph:
    """Run `record()` (which enqueues work on `stream`) under capture and instantiate the result."""
    drv = _driver()
    h = drv.CUstream(stream.handle)
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    _ok(drv.cuStreamBeginCapture(h, mode), f"cuStreamBeginCapture({name})")
    try:
        record()
    except BaseException:
        # End the capture so the stream is usable again, then re-raise the real error.
        graph = drv.cuStreamEndCapture(h)
        if isinstance(graph, tuple) and len(graph) > 1 and graph[0] == drv.CUresult.CUDA_SUCCESS:
            drv.cuGraphDestroy(graph[1])
        raise
    graph = _ok(drv.cuStreamEndCapture(h), f"cuStreamEndCapture({name})")
    counted = drv.cuGraphGetNodes(graph, 0)          # (err, nodes, count) with count asked as 0
    n_nodes = int(counted[-1]) if counted[0] == drv.CUresult.CUDA_SUCCESS else -1
    graph_exec = _ok(drv.cuGraphInstantiate(graph, 0), f"cuGraphInstantiate({name})")
    log.debug("captured CUDA graph %s (%d nodes)", name, n_nodes)
    return CapturedGraph(name, graph, graph_exec, n_nodes)
