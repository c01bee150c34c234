"""Which seat spec a command means when the operator names none: ``--seat``, else ./seat.yaml, else local-sim."""

from __future__ import annotations

from pathlib import Path

DEFAULT_PROFILE = "local-sim"
LOCAL_SEAT_FILE = "seat.yaml"


def choose_seat(seat: str | None) -> tuple[str, str | None]:
    """``--seat``, else ./seat.yaml, else the built-in local-sim; the note says which was taken when not named."""
    if seat:
        return seat, None
    if Path(LOCAL_SEAT_FILE).is_file():
        return LOCAL_SEAT_FILE, f"no --seat: using ./{LOCAL_SEAT_FILE}"
    return DEFAULT_PROFILE, f"no --seat and no ./{LOCAL_SEAT_FILE}: using the built-in {DEFAULT_PROFILE} profile"
