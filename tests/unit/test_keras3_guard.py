"""The Keras 3 guard's plumbing, with a stand-in ``keras`` package and ``tensorflow`` module (no TensorFlow here).

The real thing is tests/tensorflow/test_keras3.py; these check the import hook (TensorFlow's ``find_spec`` probe
does not import keras; the user's ``import keras`` does and gets guarded), which strategies are refused, and
which plans install the guard.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from entrypoint.cluster.environments import read_settings, resolve
from entrypoint.errors import ConfigError
from entrypoint.options import RunOptions
from entrypoint.planning.plan import make_plan
from entrypoint.tensorflow import keras3
from tests.conftest import ROOT

KERAS = '''
__version__ = "{version}"
config = type("config", (), {{"backend": staticmethod(lambda: "tensorflow")}})


class Model:
    def __init__(self, strategy=None):
        self.distribute_strategy = strategy

    def fit(self, *args, **kwargs):
        return "trained"

    evaluate = train_on_batch = test_on_batch = predict = fit
'''


class MultiWorker:
    pass


class ParameterServers:
    pass


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``tensorflow`` in sys.modules whose tf.keras is tf-keras, and a ``keras`` package to import."""
    tf = SimpleNamespace(__version__="2.99.0", keras=SimpleNamespace(__name__="tf_keras.api._v2.keras"),
                         distribute=SimpleNamespace(MultiWorkerMirroredStrategy=MultiWorker,
                                                    ParameterServerStrategy=ParameterServers))
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text(KERAS.format(version="3.99.1"))
    importlib.invalidate_caches()
    return tmp_path


def test_the_guard_waits_for_the_real_import_and_refuses_only_multi_worker_strategies(fake: Path) -> None:
    keras3.guard_script("--script")
    assert importlib.util.find_spec("keras") is not None  # TensorFlow's probe at import: keras not loaded
    assert "keras" not in sys.modules
    import keras

    assert not any(isinstance(f, keras3._WatchKeras) for f in sys.meta_path)  # gone once keras ran
    for method in keras3.GUARDED:
        with pytest.raises(ConfigError) as refused:
            getattr(keras.Model(MultiWorker()), method)()
        assert str(refused.value) == ("--script: Keras 3 (keras 3.99.1) cannot train across workers under "
                                      "MultiWorkerMirroredStrategy with TensorFlow 2.99.0: write `import tf_keras as "
                                      "keras`, or train on one node with MirroredStrategy, or use the JAX image "
                                      "(--framework jax), where Keras 3 trains across nodes")
    with pytest.raises(ConfigError, match="under ParameterServerStrategy"):
        keras.Model(ParameterServers()).fit()
    assert keras.Model(object()).fit() == "trained"  # one node: MirroredStrategy, the default strategy
    assert keras.Model(MultiWorker()).predict() == "trained"  # predict works across workers
    keras3.guard_script("--script")  # twice (a module already imported): wrapped once
    assert keras.Model.fit.__wrapped__.__name__ == "fit" and not hasattr(keras.Model.fit.__wrapped__, "__wrapped__")


def test_keras_2_is_left_alone(fake: Path) -> None:
    (fake / "keras" / "__init__.py").write_text(KERAS.format(version="2.15.0"))
    keras3.guard_script("--module")
    import keras

    assert keras.Model(MultiWorker()).fit() == "trained"
    assert keras3.keras3() is None


def test_hooks_refuse_a_keras3_model_on_one_node_and_across_workers(fake: Path) -> None:
    import keras

    model = keras.Model()
    with pytest.raises(ConfigError, match=r"^--module: m\.build_model returned a Keras 3 model \(keras 3\.99\.1\); "
                                          r"the hooks loop trains tf-keras models \(TensorFlow 2\.99\.0\): write "
                                          r"`import tf_keras as keras`, or run a Keras 3 script with --script on "
                                          r"one node$"):
        keras3.check_hooks_model(model, "m", object(), spans=False)
    with pytest.raises(ConfigError, match=r"model \(keras 3\.99\.1\), which cannot train across workers under "
                                          r"MultiWorkerMirroredStrategy with TensorFlow 2\.99\.0: write `import "
                                          r"tf_keras as keras`, or use the JAX image \(--framework jax\), where "
                                          r"Keras 3 trains across nodes$"):
        keras3.check_hooks_model(model, "m", MultiWorker(), spans=True)
    with pytest.raises(ConfigError, match=r"cannot train across workers with TensorFlow"):  # an evaluator
        keras3.check_hooks_model(model, "m", object(), spans=True)
    keras3.check_hooks_model(object(), "m", MultiWorker(), spans=True)  # a tf-keras model trains


def test_with_tf_keras_turned_off_the_line_says_tf_keras_is_keras_3(fake: Path) -> None:
    sys.modules["tensorflow"].keras = SimpleNamespace(__name__="keras._tf_keras.keras")
    import keras

    with pytest.raises(ConfigError, match=r"`import tf_keras as keras` \(tf\.keras is Keras 3 with "
                                          r"TF_USE_LEGACY_KERAS=0\)"):
        keras3.check_hooks_model(keras.Model(), "m", object(), spans=False)


@pytest.mark.parametrize(("workers", "ps", "spans"), [(0, 0, False), (1, 0, True), (2, 1, True)])
def test_only_plans_across_nodes_guard_scripts(workers: int, ps: int, spans: bool) -> None:
    spec = {"cluster": {"chief": ["c:1"], "worker": [f"w{i}:1" for i in range(workers)],
                        "ps": [f"p{i}:1" for i in range(ps)]}, "task": {"type": "chief", "index": 0}}
    env = {"TF_CONFIG": json.dumps(spec)} if workers or ps else {}
    plan = make_plan(resolve(env), RunOptions(framework="tensorflow", script=str(ROOT / "README.md")),
                     read_settings(), 0)
    assert keras3.spans_workers(plan) is spans
