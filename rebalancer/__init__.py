"""Decides: balance verdicts from thresholds (data, not code) and, later, the closed-loop controller."""
