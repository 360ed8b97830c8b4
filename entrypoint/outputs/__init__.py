"""What a job writes and where: output locations, the storage seam, checkpoints, summary, metrics, log lines.

``locations`` resolves the output directories (and Vertex's FUSE paths); ``storage`` is the one seam to local
disks and object stores (gs://); ``staging`` mirrors local-only writers to a store; ``checkpoints`` keeps the
markers, verification and retention every framework's checkpoint writer uses; ``summary``, ``hypertune``,
``logs`` and ``progress`` write the rest.
"""
