"""Trace-replay simulator: real policies and published baselines on measured spot availability."""
