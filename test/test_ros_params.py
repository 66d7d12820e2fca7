"""Configuration keys as ROS parameters: declared with type and description, validated by
config.py at start (the node exits naming the key) and on every change (refused with the reason).
"""
import subprocess

import pytest
from rcl_interfaces.msg import Parameter
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.msg import ParameterValue
from rcl_interfaces.srv import DescribeParameters
from rcl_interfaces.srv import GetParameters
from rcl_interfaces.srv import SetParameters

import ros_helpers as H
from vla_edge_ros import config as C
from vla_edge_ros.nodes import graph
from vla_edge_ros.tools.bringup import overrides_params_yaml

pytestmark = pytest.mark.ros
NODE = "camera_ingest"


def _start_and_expect_refusal(tmp_path, domain: int, node: str, params_yaml: str) -> str:
    """Start a node with a parameter file; it must exit with code 2; returns its output."""
    path = tmp_path / "params.yaml"
    path.write_text(params_yaml)
    argv = graph.node(node).command([C.default_config_path(), path])
    done = subprocess.run(argv, env=H.graph_env(domain), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, f"exit code {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.mark.parametrize("node,params,needle", [
    ("camera_ingest", {"camera.reliability": "sometimes"}, "camera.reliability must be one of"),
    ("camera_ingest", {"camera.relability": "reliable"}, "unknown parameters ['camera.relability']"),
    ("reasoning", {"cycle.safety_margin_ms": 40.0}, "must be smaller than cycle.deadline_ms"),
    ("reasoning", {"cycle.deadline_ms": 33}, "'cycle.deadline_ms': expected double"),
    ("reasoning", {"kv.dtype": "float16"}, "kv.dtype must be one of ('float32', 'bfloat16')"),
])
def test_invalid_configuration_at_start_is_refused_with_the_key(tmp_path, node, params, needle):
    out = _start_and_expect_refusal(tmp_path, H.ros_domain(__name__), node, overrides_params_yaml(params))
    assert needle in out, out


def _value(ptype: int, **kw) -> ParameterValue:
    return ParameterValue(type=ptype, **kw)


def test_parameters_declared_described_and_validated_on_change(tmp_path):
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    procs = H.GraphProcesses(env=H.graph_env(domain), nodes=(graph.node(NODE),), log_dir=tmp_path)
    procs.start()
    try:
        described = H.call_service(harness, DescribeParameters, f"/{NODE}/describe_parameters",
                                   DescribeParameters.Request(names=["vision.patch_size", "camera.reliability"]),
                                   timeout_s=H.GRAPH_START_TIMEOUT_S).descriptors
        docs = C.describe()
        assert [(d.name, d.type, d.description) for d in described] == [
            ("vision.patch_size", ParameterType.PARAMETER_INTEGER, docs["vision.patch_size"]),
            ("camera.reliability", ParameterType.PARAMETER_STRING, docs["camera.reliability"])]

        def set_params(*params):
            return H.call_service(harness, SetParameters, f"/{NODE}/set_parameters",
                                  SetParameters.Request(parameters=list(params))).results

        bad = set_params(Parameter(name="camera.reliability",
                                   value=_value(ParameterType.PARAMETER_STRING, string_value="sometimes")))[0]
        assert not bad.successful and "camera.reliability must be one of" in bad.reason, bad.reason
        # Valid on its own, impossible with the rest: 600 x 8 patches per frame do not fit kv.capacity_tokens.
        cross = set_params(Parameter(name="vision.grid_rows",
                                     value=_value(ParameterType.PARAMETER_INTEGER, integer_value=600)))[0]
        assert not cross.successful and "kv.capacity_tokens" in cross.reason, cross.reason
        undeclared = set_params(Parameter(name="camera.frobnicate",
                                          value=_value(ParameterType.PARAMETER_BOOL, bool_value=True)))[0]
        assert not undeclared.successful
        not_ours = set_params(Parameter(name="admission.ema_alpha",      # a config key camera_ingest does not use
                                        value=_value(ParameterType.PARAMETER_DOUBLE, double_value=0.5)))[0]
        assert not not_ours.successful
        good = set_params(Parameter(name="camera.max_pixels",
                                    value=_value(ParameterType.PARAMETER_INTEGER, integer_value=1000)))[0]
        assert good.successful, good.reason
        values = H.call_service(harness, GetParameters, f"/{NODE}/get_parameters",
                                GetParameters.Request(names=["camera.max_pixels", "camera.reliability"])).values
        assert (values[0].integer_value, values[1].string_value) == (1000, "best_effort")
        assert procs.dead() == {}
    finally:
        codes = procs.stop()
        harness.close()
    assert codes == {NODE: 0}
