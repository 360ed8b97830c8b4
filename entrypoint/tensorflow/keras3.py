"""Keras 3 across workers: refused before any replica trains, with one line saying what to do instead.

Keras 3 is what ``import keras`` gives (the image's ``tf.keras`` is tf-keras: TF_USE_LEGACY_KERAS=1). With the
TensorFlow backend it cannot train across workers: ``fit``, ``evaluate``, ``train_on_batch`` and ``test_on_batch``
fail under MultiWorkerMirroredStrategy (keras 3.15.1 reduces the first distributed batch as a whole, then the
scalar logs along axis 0), it has no ClusterCoordinator for ParameterServerStrategy, and ``keras.distribution``
serves JAX and PyTorch only (docs/tensorflow.md has the evidence). Keras 3 on one node (MirroredStrategy, the
default strategy, a one-worker MultiWorkerMirroredStrategy on one device) trains: nothing is installed there.

- **Script mode** (``guard_script``, only when the plan spans several nodes): an import hook waits for the
  script's ``import keras`` and wraps those four methods of Keras 3's ``Model``; a model whose strategy is
  MultiWorkerMirroredStrategy or ParameterServerStrategy raises our ``ConfigError`` on entry, before Keras' first
  collective. Every replica runs the same script, so every one refuses at the same call and none waits for a peer.
- **Hooks mode** (``check_hooks_model``, right after ``build_model``): the loop is tf-keras (its default optimizer,
  TensorBoard, BackupAndRestore), so a Keras 3 model is refused on any number of nodes.

Imports nothing heavy: Keras and TensorFlow are read from ``sys.modules`` once the user's code imported them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError
from entrypoint.planning.plan import Plan

# Keras 3's entry points that reduce across replicas and fail across workers (predict trains nothing and works).
GUARDED = ("fit", "evaluate", "train_on_batch", "test_on_batch")
FIX_IMPORT = "write `import tf_keras as keras`"
FIX_ONE_NODE = "or train on one node with MirroredStrategy"
# Keras 3 across nodes: the JAX image runs the same code on Keras' JAX backend (docs/jax.md)
FIX_JAX = "or use the JAX image (--framework jax), where Keras 3 trains across nodes"


def spans_workers(plan: Plan) -> bool:
    """Whether this job trains across nodes (several training nodes, or parameter servers)."""
    return plan.topology.num_nodes > 1 or plan.strategy == "ParameterServerStrategy"


def keras3() -> ModuleType | None:
    """Keras 3, when the user's code (or ``tf.keras`` with TF_USE_LEGACY_KERAS=0) imported it; else None."""
    keras = sys.modules.get("keras")
    major = str(getattr(keras, "__version__", "0")).split(".")[0]
    return keras if keras is not None and major.isdigit() and int(major) >= 3 else None


def _tf_version() -> str:
    return str(getattr(sys.modules.get("tensorflow"), "__version__", "?"))


def _fix_import() -> str:
    """The fix, and why ``tf.keras`` is no way out when the user turned tf-keras off."""
    tf_keras = str(getattr(getattr(sys.modules.get("tensorflow"), "keras", None), "__name__", ""))
    legacy = tf_keras.startswith("tf_keras")
    return FIX_IMPORT + ("" if legacy else f" (tf.keras is Keras 3 with {ev.TF_USE_LEGACY_KERAS}=0)")


def refusal(strategy: str, keras_version: str) -> str:
    """Why Keras 3 cannot train here and what to write instead (one line)."""
    return (f"Keras 3 (keras {keras_version}) cannot train across workers under {strategy} with TensorFlow "
            f"{_tf_version()}: {_fix_import()}, {FIX_ONE_NODE}, {FIX_JAX}")


def multi_worker_kind(strategy: Any) -> str | None:
    """``MultiWorkerMirroredStrategy`` or ``ParameterServerStrategy`` when ``strategy`` is one, else None."""
    tf = sys.modules.get("tensorflow")
    if tf is None or strategy is None:
        return None
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return "ParameterServerStrategy"
    return None


def check_hooks_model(model: Any, module_name: str, strategy: Any, spans: bool) -> None:
    """Refuse a Keras 3 model from ``build_model``: across workers Keras 3 cannot train, and on one node the
    hooks loop (tf-keras' optimizer default, TensorBoard, BackupAndRestore) cannot train it either."""
    keras = keras3()
    if keras is None or not isinstance(model, keras.Model):
        return
    built = f"{module_name}.build_model returned a Keras 3 model (keras {keras.__version__})"
    kind = multi_worker_kind(strategy)
    if spans or kind is not None:
        under = f" under {kind}" if kind else ""  # an evaluator builds under the default strategy
        raise ConfigError("--module", f"{built}, which cannot train across workers{under} with TensorFlow "
                          f"{_tf_version()}: {_fix_import()}, {FIX_JAX}")
    raise ConfigError("--module", f"{built}; the hooks loop trains tf-keras models (TensorFlow {_tf_version()}): "
                      f"{_fix_import()}, or run a Keras 3 script with --script on one node")


def guard_keras(keras: ModuleType, source: str) -> None:
    """Wrap Keras 3's training entry points to refuse a multi-worker strategy (TensorFlow backend only)."""
    if keras3() is not keras or keras.config.backend() != "tensorflow":
        return
    model_class = keras.Model
    for name in GUARDED:
        original = getattr(model_class, name)
        if getattr(original, "_entrypoint_keras3_guard", False):
            continue
        setattr(model_class, name, _guarded(original, source, str(keras.__version__)))


def _guarded(original: Callable[..., Any], source: str, keras_version: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Keras 3 records the scope's strategy when the model is made, else reads the current one.
        kind = multi_worker_kind(getattr(self, "distribute_strategy", None))
        if kind is not None:
            raise ConfigError(source, refusal(kind, keras_version))
        return original(self, *args, **kwargs)

    guarded._entrypoint_keras3_guard = True  # type: ignore[attr-defined]
    return guarded


class _WatchKeras(importlib.abc.MetaPathFinder):
    """Wraps the loading of the top-level ``keras`` package, and guards it once it has run.

    It stays first on ``sys.meta_path`` until keras has really executed: ``import tensorflow`` only probes for
    ``keras`` (``importlib.util.find_spec``) without importing it.
    """

    def __init__(self, source: str) -> None:
        self.source, self.busy = source, False

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "keras" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("keras")  # the other finders (this one answers None while busy)
        finally:
            self.busy = False
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module, watcher = loader.exec_module, self

        def exec_and_guard(module: ModuleType) -> None:
            run_module(module)
            if watcher in sys.meta_path:
                sys.meta_path.remove(watcher)
            guard_keras(module, watcher.source)

        loader.exec_module = exec_and_guard  # type: ignore[method-assign]
        return spec


def guard_script(source: str) -> None:
    """Before a multi-node script runs: refuse Keras 3 training under a multi-worker strategy (``source`` names
    the flag the script came from: ``--script`` or ``--module``)."""
    keras = sys.modules.get("keras")
    if keras is not None:
        guard_keras(keras, source)
    elif not any(isinstance(finder, _WatchKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WatchKeras(source))
