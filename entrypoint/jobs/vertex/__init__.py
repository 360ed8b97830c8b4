"""Vertex AI: the CustomJob's pools (``job.py``), its job-wide and per-pool options (``options.py``, ``pools.py``), the
platform's rules (``rules.py``), the tuning study (``tuning.py``, ``params.py``), and the writers of the job
(``formats.py``, ``pyformat.py``)."""
