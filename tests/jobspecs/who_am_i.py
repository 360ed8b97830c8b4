"""Script-mode trainer for the round-trip tests: write down what the resolver sees in this process.

Writes ``$WHO_AM_I_DIR/<replica>-<rank>.json``: the emulated replica, the resolved topology (as
``describe`` shows it), the process rank and world size, and the cluster variables as set. Imports
no ML framework, so it runs under any ``--framework`` in script mode.
"""

import json
import os
import sys

from entrypoint import context
from entrypoint.cluster.environments import resolve

topology = resolve()
facts = {
    "replica": os.environ.get("TRAINER_REPLICA"),
    "topology": topology.describe(),
    "is_chief": context.is_chief(),
    "rank": context.rank(),
    "world_size": context.world_size(),
    "cluster_spec": json.loads(os.environ.get("CLUSTER_SPEC", "null")),
    "tf_config": json.loads(os.environ.get("TF_CONFIG", "null")),
    "model_dir": os.environ.get("AIP_MODEL_DIR"),
    "spec_env": os.environ.get("FROM_SPEC_ENV"),
    "argv": sys.argv[1:],
    "trial_env": os.environ.get("CLOUD_ML_TRIAL_ID"),
}
out = os.environ["WHO_AM_I_DIR"]
with open(os.path.join(out, f"{facts['replica']}-{facts['rank']}.json"), "w") as f:
    json.dump(facts, f)
