"""Processes outside Ray on a host: the engine's own parent, the local cluster, engine process groups."""
