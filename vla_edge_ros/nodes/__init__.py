"""Thin rclpy adapters around the engine. Only this package imports rclpy."""
