"""vla_edge_ros: a vision-language-action model as a hard real-time ROS 2 policy.

Importing this package has no side effects: no rclpy, no CUDA, no file reads.
"""
__version__ = "0.1.0"
