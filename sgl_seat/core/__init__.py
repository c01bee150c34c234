"""The pure core that the live watchdog and offline forensics share.

``records`` (the typed records a sidecar collects and a bundle stores), ``columns`` (probe records as
numpy columns: a bundle holds a million of them), ``observation`` (what the detectors look at), ``frames``
(which frame of a stack to name) and ``detect`` (the detectors and their thresholds). Nothing here touches
Ray, processes, files or the clock, so ``sgl_seat.watchdog`` (live) and ``sgl_seat.forensics`` (replay)
reach the same verdict from the same records. It imports only ``sgl_seat.errors``, ``sgl_seat.spec`` (the
thresholds' type) and numpy.
"""
