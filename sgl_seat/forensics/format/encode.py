"""A bundle's files from its records: which record goes into which file, in which encoding, in one place.

:func:`encode_bundle` is the counterpart of :func:`~sgl_seat.forensics.format.bundle.read_bundle`: the live capture
(``sgl_seat.watchdog.capture.assemble``) and the golden-fixture builder (``tests/fixtures/make_bundles.py``)
both call it, so a fixture is encoded exactly as a live bundle is. It returns the files; writing them with
their manifest is :func:`~sgl_seat.forensics.format.bundle.write_bundle`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sgl_seat.core.records import EngineProcess, LogLine, MetricsPoint, ProbeRecord, StackSample
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.codec import (
    encode_env,
    encode_json,
    encode_logs,
    encode_probe_records,
    encode_records,
    encode_stack_samples,
    encode_text,
)
from sgl_seat.forensics.format.redact import RequestShape

__all__ = ["encode_bundle"]


def encode_bundle(
    *,
    stacks: Iterable[StackSample],
    native_stacks: Iterable[StackSample],
    probes: Iterable[ProbeRecord],
    metrics: Iterable[MetricsPoint],
    processes: Iterable[EngineProcess],
    logs: Iterable[LogLine],
    env: Mapping[int, Mapping[str, str]],
    requests: Sequence[RequestShape] | None = None,
    log_text: Mapping[int, str] | None = None,
    process_state: Mapping[int, Any] | None = None,
    gpu: Mapping[int, str] | None = None,
    logs_scrubbed: bool = False,
) -> dict[str, bytes]:
    """Every file of a bundle, by its name in :mod:`~sgl_seat.forensics.format.layout`.

    ``requests`` None: no request log was recorded (no ``requests.jsonl``; an empty list writes an empty one).
    ``log_text``, ``process_state`` and ``gpu`` are per node: the engine log tail, psutil's view of its
    processes and ``nvidia-smi -q``; a node without an entry gets no such file.
    ``logs_scrubbed``: ``logs`` and ``log_text`` were scrubbed already (by each node, beside its stack dumps, with
    the same :func:`~sgl_seat.forensics.format.scrub.scrub_lines`), so they are written as they are.
    """
    files: dict[str, bytes] = {
        layout.STACKS: encode_stack_samples(stacks),
        layout.NATIVE_STACKS: encode_stack_samples(native_stacks),
        layout.PROBE: encode_probe_records(probes),
        layout.METRICS: encode_records(metrics),
        layout.PROCESSES: encode_records(processes),
        layout.LOGS: encode_records(logs) if logs_scrubbed else encode_logs(logs),
        layout.ENV: encode_env(env),
    }
    if requests is not None:
        files[layout.REQUESTS] = encode_records(requests)
    for node, text in (log_text or {}).items():
        files[layout.log_file(node)] = text.encode("utf-8", "replace") if logs_scrubbed else encode_text(text)
    for node, doc in (process_state or {}).items():
        files[layout.process_state_file(node)] = encode_json(doc)
    for node, text in (gpu or {}).items():
        files[layout.gpu_file(node)] = encode_text(text)
    return files
