"""What runs: the framework registry, the ``run`` command line, the user's code, the plan and its handoff.

``plan.make_plan`` decides once per node (framework, strategy, processes, outputs, user code); ``handoff``
passes the plan to the node's workers without touching the disk.
"""
