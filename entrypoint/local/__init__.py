"""``python -m entrypoint local``: the platform emulated on one machine.

``pools`` lays out the worker pools and each replica's CLUSTER_SPEC / TF_CONFIG; ``emulator`` starts,
supervises and restarts the replicas; ``specfile`` reads a job spec written by ``entrypoint job`` back into
the same pools (``local --spec``).
"""
