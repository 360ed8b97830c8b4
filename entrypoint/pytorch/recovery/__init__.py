"""What keeps the hooks loop safe, in two parts: the guard from the first hook (``guard.py``: stop signals in every
phase, the watchdog and the stop's deadline, the platform's advance notice, the ledger's phases, the group and naming
a lost peer), and the step guard built with the parallel layout (``steps.py``: the per-step vote and non-finite
losses, saves and stops, stops outside a step in ``stops.py``, survivors that keep training in ``survivors.py``)."""
