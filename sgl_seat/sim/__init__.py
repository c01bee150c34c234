"""The sim engine: a stand-in for SGLang 0.5.23 that speaks its wire contract with no GPU.

Started as ``python -m sgl_seat.sim.launch_server <the same flags sgl-seat gives SGLang>``, it builds the
same process tree and titles, rendezvouses its scheduler ranks across nodes through ``torch.distributed``
(gloo), runs a real collective and a real host-memory row gather every step, serves SGLang's HTTP routes
and Prometheus names on node 0, and can be told to stall, crash or slow a rank. Every figure it produces
is synthetic and is labelled so.

Module map (each small, each with one job):

- ``args``: the command line (SGLang's flag names) and the sim's environment knobs -> ``SimConfig``.
- ``contract``: every name the sim claims to share with SGLang (routes, fields, metrics, titles, log lines).
- ``faults``: fault specs (``KIND:key=value,...``) and when they fire.
- ``costmodel``: per-step wall time and draft acceptance (the paper's shape).
- ``tokens``: tokenizer / detokenizer stand-in and deterministic greedy token ids.
- ``radix``: the radix-style prefix cache and KV pool accounting.
- ``batch``: rank 0's continuous batching (pure; no torch, no sockets).
- ``rowfetch``: the host-memory embedding row gather (the function the watchdog's probe wraps).
- ``wire``, ``procs``, ``logs``: framing, process-tree helpers, SGLang-style logging.
- ``scheduler``, ``detokenizer``, ``worker``: the child processes.
- ``frontend``, ``api``, ``metrics``, ``http``, ``admin``: node 0's HTTP server and node >= 1's dummy one.
- ``launch_server``: the entry point.
"""
