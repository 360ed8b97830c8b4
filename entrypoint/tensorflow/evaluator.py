"""The evaluator replica: a sidecar that evaluates each newly committed checkpoint until training is done.

It never joins the training collectives (it runs under the default strategy and is outside
TF_CONFIG's ``cluster``), reads only committed checkpoints, and writes its own metrics to
``<tensorboard_dir>/eval``: ``metrics.jsonl`` (one line per checkpoint) and TensorBoard scalars.
With gs:// outputs without the FUSE mount it lists and verifies checkpoints on the bucket, loads each from a
downloaded copy, and writes its metrics in its staging directory, uploaded after each evaluation.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from entrypoint.errors import ConfigError, ExitCode
from entrypoint.lifecycle.signals import stop_at_once
from entrypoint.outputs.checkpoints import committed, read_marker
from entrypoint.outputs.staging import Staging
from entrypoint.outputs.storage import Location
from entrypoint.planning.plan import Plan
from entrypoint.planning.usercode import parse_user_args
from entrypoint.tensorflow.done import DoneWatcher
from entrypoint.tensorflow.hooks import build_compiled_model, make_context, user_datasets

log = logging.getLogger("entrypoint.tensorflow")
EVAL_SUBDIR = "eval"
METRICS_FILE = "metrics.jsonl"
POLL_SECONDS = 1.0


def newest_unevaluated(checkpoint_dir: Location, evaluated: set[int]) -> tuple[int, Location] | None:
    """The newest committed checkpoint not evaluated yet (older ones are skipped when behind)."""
    found = committed(checkpoint_dir, warn=False)
    if not found or found[-1][0] in evaluated:
        return None
    return found[-1]


def evaluate_checkpoint(model: Any, data: Any, path: Location, staging: Staging) -> dict[str, Any] | None:
    """Load ``path`` into ``model`` and evaluate: its epoch and metrics; None when the chief pruned it meanwhile."""
    import tensorflow as tf

    try:
        epoch = read_marker(path).get("epoch")
        model.load_weights(str(staging.pull_checkpoint(path) / "weights")).expect_partial()
    except (tf.errors.OpError, OSError, ValueError) as exc:
        log.warning("could not load %s (pruned while reading?): %s", path, exc)
        return None
    metrics = model.evaluate(data, verbose=0, return_dict=True)
    return {"epoch": epoch, **{name: float(value) for name, value in metrics.items()}}


def evaluate_forever(plan: Plan, module: ModuleType) -> int:
    """Evaluate each new committed checkpoint; exit 0 after the last one once the chief is done."""
    with stop_at_once("evaluating checkpoints (nothing to save)"), Staging(plan.outputs) as staging:
        return _evaluate_forever(plan, module, staging)  # SIGTERM: exit 143 at once, with a record


def _evaluate_forever(plan: Plan, module: ModuleType, staging: Staging) -> int:
    import tensorflow as tf

    options = plan.options
    args = parse_user_args(module, options.user_args)
    tf.keras.utils.set_random_seed(options.seed)
    ctx = make_context(plan, module, tf.distribute.get_strategy(), staging)
    model = build_compiled_model(module, args, ctx)
    evaluation = user_datasets(module, args, ctx)[1]
    if evaluation is None:
        raise ConfigError("--module", f"{module.__name__}.build_datasets returned no eval dataset for the evaluator")
    data = evaluation.batch(ctx.per_replica_batch_size).prefetch(tf.data.AUTOTUNE)
    checkpoint_dir, out = staging.target("checkpoints"), Path(ctx.tensorboard_dir) / EVAL_SUBDIR
    published = staging.target("tensorboard") / EVAL_SUBDIR
    staging.pull(published, out)  # a restarted evaluator appends to what it wrote before
    out.mkdir(parents=True, exist_ok=True)
    writer = tf.summary.create_file_writer(str(out))
    watcher = DoneWatcher(checkpoint_dir, plan.topology.chief_address, options.timeout)
    evaluated: set[int] = set()
    log.info("evaluator watching %s for committed checkpoints", checkpoint_dir)
    while True:
        done = watcher.done()  # read before listing: the final checkpoint is committed before the marker
        newest = newest_unevaluated(checkpoint_dir, evaluated)
        if newest is None:
            if done:
                break
            watcher.check_chief()
            time.sleep(POLL_SECONDS)
            continue
        step, path = newest
        evaluated.add(step)
        result = evaluate_checkpoint(model, data, path, staging)
        if result is None:
            continue
        with (out / METRICS_FILE).open("a") as f:
            f.write(json.dumps({"step": step, "checkpoint": str(path), **result}, sort_keys=True) + "\n")
        metrics = {k: v for k, v in result.items() if k != "epoch"}
        with writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(name, value, step=step)
        writer.flush()
        staging.push(out, published)
        log.info("evaluated %s: %s", path.name, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    log.info("training is done: evaluated %d checkpoint(s)", len(evaluated))
    return ExitCode.OK
