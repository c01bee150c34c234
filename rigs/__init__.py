"""Rigs the tests and the benches both run: a sim seat without Ray, the two-namespace cluster, the watchdog soak.

Not in the wheel and not a test module: tests import them (pytest runs from the checkout's root) and bench
scripts put the checkout on ``sys.path`` first. No module here imports from ``tests/`` or ``bench/``.
"""
