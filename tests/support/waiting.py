"""Polling for tests: kubeloop's one helper."""

from kubeloop.polling import wait_for

__all__ = ["wait_for"]
