"""Supervised local processes and the platforms' restart policies."""
