"""core/health.py verdicts as /diagnostics statuses and as log lines on a change.

The level of each node's DiagnosticStatus is its `Health.level`; the message
starts with what is wrong ("ok" when nothing is). A change of the set of
problems is logged once at the matching severity, so an operator reading the
log sees "reconciler lost" when it happens, not a line every second.
"""
from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray

from ..core import health as hl
from . import conversions as conv


def diagnostics_array(node, health: hl.Health, values: dict, detail: str = "") -> DiagnosticArray:
    """One-status DiagnosticArray 'vla_edge: <node>' at the health's level, stamped now."""
    message = health.message + (f" ({detail})" if detail else "")
    status = conv.status_msg(f"vla_edge: {node.get_name()}", bytes([health.level]), message, values)
    array = DiagnosticArray(status=[status])
    array.header.stamp = node.get_clock().now().to_msg()
    return array


def log_change(logger, tracker: hl.HealthLog, health: hl.Health) -> None:
    change = tracker.change(health)
    if change is None:
        return
    level, text = change
    # One call site per severity: rclpy refuses a severity change at one call site.
    if level == hl.ERROR:
        logger.error(f"diagnostics: {text}")
    elif level == hl.WARN:
        logger.warning(f"diagnostics: {text}")
    else:
        logger.info(f"diagnostics: {text}")
