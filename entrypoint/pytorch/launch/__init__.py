"""How the PyTorch processes start and meet: the node's launcher (``node.py``: in this process, or torch's
elastic agent), the job's store and start-up barrier, the process groups and their collectives, the group's
membership and the node watch."""
