"""Subcommands of the `vla-edge` command, one module each.

Each module defines `add_arguments(parser)` and `run(args) -> int` and imports
its heavy dependencies (torch, rclpy, ...) inside `run`, so `vla-edge --help`
stays instant.
"""
