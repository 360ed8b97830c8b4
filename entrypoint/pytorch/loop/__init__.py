"""The hooks loop: the ``Trainer`` (``trainer.py``), its data, evaluation, parallel layout, first weights and
export, and the worker process that runs it or the user's script (``worker.py``)."""
