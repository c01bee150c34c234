"""How a verdict's evidence writes a duration and a threshold (replay's agreement reads them back)."""

from __future__ import annotations


def fmt_s(x: float) -> str:
    return f"{x:.1f}s"


def fmt_th(x: float) -> str:
    """A threshold: sub-second ones (learned, or stopped_s) with their second digit."""
    return fmt_s(x) if x >= 1 else f"{x:.2g}s"
