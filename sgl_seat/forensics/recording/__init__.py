"""Recording request shapes on the seat side, and re-driving them as traffic against a live seat."""
