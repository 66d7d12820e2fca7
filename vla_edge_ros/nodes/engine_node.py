"""The lifecycle shared by the two nodes that hold an engine (reasoning, reconciler).

Both run work of their own while active (the cycle thread; the reconciler's worker and its swap
service) and hold an engine whose memory must be given back (device memory on a GPU). What differs
is what their work and their engine are; when each is stopped and freed is the same, and written
here once:

    deactivate      stop the work (the state is kept: a later activate carries on)
    cleanup         free the engine
    shutdown        stop the work, free the engine (from any primary state)
    process exit    the same as shutdown (node_main calls close() before destroy_node)
"""
from __future__ import annotations

from rclpy.lifecycle import LifecycleNode
from rclpy.lifecycle import LifecycleState
from rclpy.lifecycle import TransitionCallbackReturn


class EngineNode(LifecycleNode):
    def _stop_work(self) -> None:
        """Stop what runs while active; idempotent (shutdown and close may follow a deactivate)."""
        raise NotImplementedError

    def _free(self) -> None:
        """Give the engine's memory back; idempotent."""
        raise NotImplementedError

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> inactive: the work stops (the one cycle or step in flight ends first)."""
        self._stop_work()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> unconfigured: the engine's memory is given back."""
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS -> finalized, from any primary state."""
        self.close()
        return TransitionCallbackReturn.SUCCESS

    def close(self) -> None:
        """Process exit (node_main): the work stopped and the engine freed before the node is destroyed."""
        self._stop_work()
        self._free()
