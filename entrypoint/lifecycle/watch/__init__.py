"""Watches while training: the peers' heartbeats, the hang watchdog, the platform's advance notice."""
