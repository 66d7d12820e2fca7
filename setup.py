"""ament_python package: `colcon build` on a robot, `pip install -e .` anywhere else."""
from glob import glob

from setuptools import find_packages, setup

package_name = "vla_edge_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.launch.py")),
        ("share/" + package_name + "/config", glob("config/*.yaml")),
        ("share/" + package_name + "/cuda", glob("cuda/*.cu") + glob("cuda/*.cuh")),   # found via resources.py
    ],
    package_data={package_name: []},
    install_requires=["setuptools", "numpy", "pyyaml", "safetensors"],
    # The GPU backend: PyCUDA compiles cuda/*.cu at run time, cuda-python captures and replays CUDA graphs.
    extras_require={"gpu": ["pycuda>=2024.1", "cuda-python>=12.0"]},
    zip_safe=False,
    maintainer="vla_edge_ros developers",
    maintainer_email="vla-edge@example.com",
    description="Vision-language-action model as a hard real-time ROS 2 policy",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "vla-edge = vla_edge_ros.cli:main",
            "camera_ingest = vla_edge_ros.nodes.camera_ingest:main",
            "reasoning = vla_edge_ros.nodes.reasoning:main",
            "reconciler = vla_edge_ros.nodes.reconciler:main",
        ],
    },
)
