"""Offline replay of a bundle: the detectors re-run, the analysis, and the text, HTML and viewer exports."""
