"""Judging served models by their outcomes: late labels joined to logged predictions, live quality, and the sequential comparison of two versions."""
