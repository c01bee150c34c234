"""The watchdog sidecar: sampler (py-spy), probe (in-engine row-fetch timer), detectors, capture."""
