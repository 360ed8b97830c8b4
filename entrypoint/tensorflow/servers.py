"""ParameterServerStrategy's ps and worker replicas: serve tf.distribute.Server until the chief is done."""

from __future__ import annotations

import logging

from entrypoint.errors import ExitCode
from entrypoint.lifecycle.signals import stop_at_once
from entrypoint.outputs import storage
from entrypoint.outputs.locations import local_path
from entrypoint.planning.plan import Plan
from entrypoint.tensorflow.done import DoneWatcher
from entrypoint.tensorflow.strategy import cluster_resolver

log = logging.getLogger("entrypoint.tensorflow")


def serve(plan: Plan) -> int:
    """Start this replica's server, serve the chief's coordinator, exit 0 once it announces the end."""
    import tensorflow as tf

    watcher = DoneWatcher(storage.path(local_path(plan.outputs.checkpoint_dir)), plan.topology.chief_address,
                          plan.options.timeout)
    resolver = cluster_resolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    log.info("serving %s %d at %s until the chief is done", resolver.task_type, resolver.task_id, server.target)
    # After the server start (TensorFlow's own SIGTERM handler, if any, is replaced): nothing to save here.
    with stop_at_once(f"serving as {resolver.task_type} {resolver.task_id} (nothing to save)"):
        watcher.wait()
    log.info("the chief announced the end of training: stopping")
    return ExitCode.OK
