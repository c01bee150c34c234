"""Prometheus: a sidecar's own exporter, the seat's scrape config; the alert rules are the YAML files beside them."""
