"""The pure core that the live watchdog and offline forensics share.

``records`` (the typed records a sidecar collects and a bundle stores), ``columns`` (probe records as
numpy columns: a bundle holds a million of them), ``observation`` (what the detectors look at), ``frames``
(which frame of a stack to name), ``detect`` (the detectors and their thresholds) and ``remediation`` (what
the seat's ``watchdog.on_hang`` policy does about a verdict: the supervisor's decision, and the record of it).
Nothing here touches Ray, processes, files or the clock, so ``sgl_seat.watchdog`` (live) and
``sgl_seat.forensics`` (replay) reach the same verdict from the same records. It imports only
``sgl_seat.errors``, ``sgl_seat.spec`` (the thresholds' type) and numpy.
"""
