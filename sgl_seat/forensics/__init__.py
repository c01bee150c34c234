"""Forensic bundles: format (write, read, verify, redact, scrub), archives, analysis, reports, traffic replay.

The live watchdog writes bundles with :func:`encode_bundle` and :func:`write_bundle`; ``replay``
reads them back with :func:`read_bundle` into the same record types (``sgl_seat.core.records``).
File names and limits live in :mod:`sgl_seat.forensics.format.layout`.
"""

from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.bundle import Bundle, read_bundle, rotate_bundles, verify_bundle, write_bundle
from sgl_seat.forensics.format.codec import (
    ProbeTable,
    encode_env,
    encode_json,
    encode_logs,
    encode_probe_records,
    encode_records,
    encode_stack_samples,
    encode_text,
)
from sgl_seat.forensics.format.encode import encode_bundle
from sgl_seat.forensics.format.manifest import BundleVersionError, Manifest
from sgl_seat.forensics.format.redact import Redactor, RequestShape
from sgl_seat.forensics.format.scrub import scrub_env, scrub_json, scrub_text
from sgl_seat.forensics.recording.recorder import RequestRecorder

__all__ = [
    "Bundle",
    "BundleVersionError",
    "Manifest",
    "ProbeTable",
    "Redactor",
    "RequestRecorder",
    "RequestShape",
    "encode_bundle",
    "encode_env",
    "encode_json",
    "encode_logs",
    "encode_probe_records",
    "encode_records",
    "encode_stack_samples",
    "encode_text",
    "layout",
    "read_bundle",
    "rotate_bundles",
    "scrub_env",
    "scrub_json",
    "scrub_text",
    "verify_bundle",
    "write_bundle",
]
