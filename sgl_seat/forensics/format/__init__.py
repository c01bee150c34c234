"""The bundle format: write, verify, read, encode, redact, scrub, annotate, merge, archive, and find bundles on disk."""
