"""The lifecycle shared by the two nodes that hold an engine (reasoning, reconciler).

Both run work of their own while active (the cycle thread; the reconciler's worker and its swap
service) and hold an engine whose memory must be given back (device memory on a GPU). What differs
is what their work and their engine are; when each is stopped and freed is the same, and written
here once:

    deactivate      stop the work (the state is kept: a later activate carries on)
    cleanup         free the engine
    shutdown        stop the work, free the engine (from any primary state); finalized, the process then exits
                    (node_main's spin ends: a finalized node serves nothing, and a supervisor or launch file
                    should see it gone rather than a live process that never publishes again; a node whose row
                    says respawn, the reconciler, is then started again by that policy: stop the graph to stop it)
    process exit    the same as shutdown (node_main calls close() before destroy_node)

A transition the current state does not have, requested by id (as nav2's lifecycle manager and most scripts
send them), is answered success=False with a warning: rclpy 7.1.6 raises inside its ChangeState service
instead, and the caller never got an answer.
"""
from __future__ import annotations

from rclpy.lifecycle import LifecycleNode
from rclpy.lifecycle import LifecycleState
from rclpy.lifecycle import TransitionCallbackReturn


class EngineNode(LifecycleNode):
    finalized = False        # set by the shutdown transition: node_main's spin loop ends

    def _LifecycleNodeMixin__on_change_state(self, req, resp):
        """The ChangeState service (rclpy's LifecycleNodeMixin binds this name-mangled method when it makes the
        service, so this definition is the one served): a transition id the current state lacks is answered
        success=False, where rclpy raises and the request is never answered. Labels and valid ids go to rclpy."""
        if not req.transition.label:
            available = {t[0] for t in self._state_machine.available_transitions}
            if req.transition.id not in available:
                state = self._state_machine.current_state[1]
                self.get_logger().warning(f"transition {req.transition.id} requested in state {state!r}, which "
                                          f"offers {sorted(available)}: refused")
                resp.success = False
                return resp
        return super()._LifecycleNodeMixin__on_change_state(req, resp)

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
        """SUCCESS -> finalized, from any primary state; the process exits after it (the module docstring)."""
        self.close()
        self.finalized = True
        self.get_logger().info("finalized: the process exits")
        return TransitionCallbackReturn.SUCCESS

    def close(self) -> None:
        """Process exit (node_main): the work stopped and the engine freed before the node is destroyed."""
        self._stop_work()
        self._free()
