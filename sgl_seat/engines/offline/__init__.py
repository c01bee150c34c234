"""Offline engine packages for a GPU host without a registry: the targets (pins, trim rules with their reasons, the
host's check), the builder, and the layout script that travels inside each package (standard library only)."""
