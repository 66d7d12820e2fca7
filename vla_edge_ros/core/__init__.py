"""ROS-free engine: the cycle, its parts and their policies."""
