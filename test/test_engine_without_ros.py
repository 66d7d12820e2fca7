"""The engine must import and run where rclpy does not exist (benchmarks, offline tools, other middleware)."""
import subprocess
import sys
import textwrap


def test_engine_and_model_import_with_rclpy_unavailable():
    code = textwrap.dedent("""
        import sys
        # Make any attempt to import ROS fail loudly.
        for name in ("rclpy", "sensor_msgs", "std_msgs", "cv_bridge", "diagnostic_msgs"):
            sys.modules[name] = None
        import importlib, pkgutil
        import vla_edge_ros.core as core, vla_edge_ros.model as model, vla_edge_ros.bench as bench
        for pkg in (core, model, bench):
            for m in pkgutil.iter_modules(pkg.__path__):
                importlib.import_module(f"{pkg.__name__}.{m.name}")
        import vla_edge_ros.config, vla_edge_ros.cli
        loaded = [m for m in sys.modules if m.split(".")[0] in ("rclpy", "pycuda", "torch")]
        assert not [m for m in loaded if sys.modules[m] is not None], loaded
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
