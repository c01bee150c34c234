"""`sgl-seat bundle ls|show|verify|pack|unpack` (filled by the forensics issue)."""

from __future__ import annotations

import typer

from sgl_seat.cli.common import not_built

app = typer.Typer(help="List, show, verify, pack and unpack forensic bundles.", no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    """List bundles with trigger, verdict and size (not built yet)."""
    not_built("bundle ls", "issue: forensic bundles and offline replay")


@app.command("verify")
def verify() -> None:
    """Verify a bundle's checksums and schema (not built yet)."""
    not_built("bundle verify", "issue: forensic bundles and offline replay")
