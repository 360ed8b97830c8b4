"""What keeps the hooks loop safe: its guard from the first hook (``guard.py``: stop signals in every phase, the
watchdog and the stop's deadline, the platform's advance notice, the ledger's phases, naming a lost peer), the
per-step vote and non-finite losses, stops outside a step (``stops.py``), and survivors that keep training
(``resilience.py`` is the loop's one object for all of it)."""
