"""The seat's Ray actors: the node agent (one per node, owns its engine) and the supervisor (heals after a hang)."""
