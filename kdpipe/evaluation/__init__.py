"""Evaluation: metrics, calibration and uncertainty, and the files an evaluation writes."""
