"""Benchmarks behind `vla-edge bench`: each compares against a baseline measured in the same run."""
