"""Where the job runs: the platform's variables read once, the node and its processes placed.

``environments/`` turns whatever the platform set (CLUSTER_SPEC, TF_CONFIG, torchrun, MPI...) into one
``topology.ClusterTopology``; ``placement.place`` gives each process its ranks; ``envvars`` names every
variable; ``gpus`` counts the devices.
"""
