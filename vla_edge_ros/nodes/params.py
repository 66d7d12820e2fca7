"""Configuration keys as ROS parameters, for all three nodes.

Every dotted key of `VlaConfig.flat()` in the sections a node uses becomes a
statically typed ROS parameter carrying its description from
`config.describe()`. The node's `VlaConfig` is built from those parameter
values and validated by config.py, both at start (an invalid value raises
`ConfigError` naming the key, the node exits) and afterwards in an
on-set-parameters callback that refuses invalid values with the same reason.

A change is applied whole or refused with a reason, never half-applied. Each
node names its `live_keys`, the keys it can apply while running (each at a
point where nothing is reading the old value: the reasoning node at a cycle
boundary); while `fixed()` says the node's resources were built from the
configuration (a lifecycle node that is configured, or any plain node once
started), a change to any other key is refused, naming the keys and what to
do instead. A lifecycle node accepts every valid change while unconfigured:
the next configure builds from it, except PROCESS_KEYS, read once when the
process starts (the executor every callback runs on): a change to one of those
is always refused, since no transition would apply it.

Refused at start as well: parameter overrides (from `--params-file` or `-p`)
naming a key no section of `VlaConfig` has, e.g. a typo `cycle.deadline_s`, or
a key it no longer has (`config.REMOVED_KEYS`: the error says where it went).
Keys of sections the node does not use are ignored, because the shared
`/**` block of config/vla_edge.yaml gives every node every section.
"""
from __future__ import annotations

import logging

from rcl_interfaces.msg import ParameterDescriptor
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import InvalidParameterTypeException
from rclpy.exceptions import InvalidParameterValueException

from .. import config as C

log = logging.getLogger(__name__)

# Read once at process start (nodes/node_main.py: make_executor, pin_mmap_threshold).
PROCESS_KEYS = frozenset({"cycle.executor", "memory.malloc_mmap_threshold_mib"})

_ROS_TYPE_NAMES = {
    ParameterType.PARAMETER_BOOL: "bool",
    ParameterType.PARAMETER_INTEGER: "integer",
    ParameterType.PARAMETER_DOUBLE: "double",
    ParameterType.PARAMETER_STRING: "string",
    ParameterType.PARAMETER_STRING_ARRAY: "string array",
}


def ros_type_of(value) -> int:
    """ROS parameter type of a config value (config.py field types: bool, int, float, str, tuple of str)."""
    if isinstance(value, bool):
        return ParameterType.PARAMETER_BOOL
    if isinstance(value, int):
        return ParameterType.PARAMETER_INTEGER
    if isinstance(value, float):
        return ParameterType.PARAMETER_DOUBLE
    if isinstance(value, str):
        return ParameterType.PARAMETER_STRING
    if isinstance(value, tuple):
        return ParameterType.PARAMETER_STRING_ARRAY
    raise C.ConfigError(f"no ROS parameter type for config value {value!r} ({type(value).__name__})")


def section_keys(sections: tuple | None, base: C.VlaConfig) -> dict:
    """{dotted key: default value} of the given sections (None: all), in config order."""
    flat = base.flat()
    if sections is None:
        return dict(flat)
    known = {k.partition(".")[0] for k in flat}
    unknown = [s for s in sections if s not in known]
    if unknown:
        raise C.ConfigError(f"unknown configuration sections {unknown}; known: {sorted(known)}")
    return {k: v for k, v in flat.items() if k.partition(".")[0] in sections}


class NodeParameters:
    """Declares a node's configuration parameters and keeps its validated `VlaConfig`.

    `sections=None` declares every section. `on_change(cfg, changed_keys)` runs
    after an accepted change. `live_keys` and `fixed` as in the module docstring
    (`fixed` None: always fixed, `until` says when that ends).
    """

    def __init__(self, node, sections: tuple | None = None, base: C.VlaConfig | None = None, on_change=None,
                 live_keys: tuple = (), fixed=None, until: str = "restart the node with the new value"):
        self._node = node
        self._base = base or C.VlaConfig()
        self._on_change = on_change
        self.live_keys = frozenset(live_keys)
        self._fixed = fixed if fixed is not None else (lambda: True)
        self._until = until
        self.keys = section_keys(sections, self._base)
        self._check_overrides()
        values = self._declare_all()
        self.config = self._build(values)
        node.add_on_set_parameters_callback(self._validate_change)
        node.add_post_set_parameters_callback(self._apply_change)

    # ------------------------------------------------------------------ public

    def values(self) -> dict:
        """{dotted key: current value} of the declared parameters."""
        return {k: self.config.flat()[k] for k in self.keys}

    # ------------------------------------------------------------- internals

    def _check_overrides(self) -> None:
        # rclpy keeps the parsed --params-file / -p values here; there is no public accessor.
        overrides = getattr(self._node, "_parameter_overrides", {}) or {}
        known = set(self._base.flat())
        own = set(self._node._parameters)    # use_sim_time etc., declared by rclpy itself
        unknown = sorted(name for name in overrides if name not in known and name not in own)
        for name in unknown:
            C.check_not_removed(name)        # a removed key: say where its choice lives now
        if unknown:
            raise C.ConfigError(f"node {self._node.get_name()!r}: unknown parameters {unknown}; "
                                f"every parameter is a configuration key such as 'cycle.deadline_ms'")

    def _declare_all(self) -> dict:
        docs = C.describe()
        values = {}
        for key, default in self.keys.items():
            ros_type = ros_type_of(default)
            descriptor = ParameterDescriptor(name=key, type=ros_type, description=docs.get(key, ""))
            declared_default = list(default) if isinstance(default, tuple) else default
            try:
                param = self._node.declare_parameter(key, declared_default, descriptor)
            except InvalidParameterTypeException as exc:
                raise C.ConfigError(f"parameter {key!r}: expected {_ROS_TYPE_NAMES[ros_type]} "
                                    f"(default {default!r}); {exc}") from exc
            except InvalidParameterValueException as exc:
                raise C.ConfigError(f"parameter {key!r}: {exc}") from exc
            values[key] = param.value
        return values

    def _build(self, values: dict) -> C.VlaConfig:
        # ROS hands arrays back as lists (or array.array for numbers); config.py wants plain lists of str.
        clean = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in values.items()}
        return self._base.replace(clean)

    def _validate_change(self, params) -> SetParametersResult:
        """On-set callback: refuse a change config.py rejects, with its reason."""
        changed = {p.name: p.value for p in params if p.name in self.keys}
        if not changed:
            return SetParametersResult(successful=True)
        try:
            new = self._build({**self.values(), **changed})    # an invalid value: config.py's reason first
        except C.ConfigError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        old, new = self.config.flat(), new.flat()
        process = sorted(k for k in changed if k in PROCESS_KEYS and new[k] != old[k])
        if process:
            return SetParametersResult(successful=False, reason=(
                f"{self._node.get_name()}: {process} is read once when the node process starts; restart the "
                f"process with the new value"))
        fixed = sorted(k for k in changed if k not in self.live_keys and new[k] != old[k])   # same value: no change
        if fixed and self._fixed():
            live = f"; live: {sorted(self.live_keys)}" if self.live_keys else ""
            return SetParametersResult(successful=False, reason=(
                f"{self._node.get_name()}: {fixed} cannot change while running (built into what it runs); "
                f"{self._until}{live}"))
        return SetParametersResult(successful=True)

    def _apply_change(self, params) -> None:
        """Post-set callback: the change was validated and stored; rebuild the config."""
        changed = {p.name: p.value for p in params if p.name in self.keys}
        if not changed:
            return
        self.config = self._build({**self.values(), **changed})
        log.info("%s: configuration change accepted: %s", self._node.get_name(), sorted(changed))
        if self._on_change is not None:
            self._on_change(self.config, sorted(changed))
