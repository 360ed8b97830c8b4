"""The hooks loop's checkpoints: one format per parallel layout (``formats.py``), the writers (``checkpoint_io.py``,
``sharded_io.py``), the state dicts' side of a cross-format load (``restore.py``), which checkpoint a resume takes
(``resume.py``)."""
