"""Recording request shapes on the seat side, re-driving them as traffic against a live seat, and the load generator
that keeps a seat busy (the demo, the rigs, the tests and the benches)."""
