"""Ray side of a seat: cluster connection, placement group, node agents, seat state, teardown.

``apply`` is the entry point (``up``, ``down``, ``status``, ``logs``); the rest are its parts, each
importable without Ray (Ray is imported inside the functions that need it, after the environment
it reads at import time has been set).
"""
