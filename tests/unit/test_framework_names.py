"""The names the failure classes rely on, resolved against the pinned frameworks: each framework's lost-peer types
(``Framework.peer_errors``) and the modules its collectives and store run in (``peer_modules``) exist in the release
its image pins, so ``failures.classify`` can meet them (docs/EXIT_CODES.md, 129).

A renamed or moved type would otherwise never match: a lost peer read as the user's error (1, permanent). Each
framework's case runs in its own tier (its marker): the PyTorch one in the catch-all tier, TensorFlow's and
Horovod's and JAX's in theirs, whose venvs hold those releases; nothing here is skipped for a missing framework.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from entrypoint import errors, failures
from entrypoint.planning import registry


@pytest.mark.parametrize("name", [pytest.param("pytorch", marks=pytest.mark.pytorch),
                                  pytest.param("tensorflow", marks=pytest.mark.tensorflow),
                                  pytest.param("horovod", marks=pytest.mark.horovod),
                                  pytest.param("jax", marks=pytest.mark.jax)])
def test_a_frameworks_lost_peer_types_and_modules_exist_in_its_pinned_release(name: str) -> None:
    record = registry.get(name)
    assert record.peer_errors and record.peer_modules
    for dotted in record.peer_errors:
        module, _, attribute = dotted.rpartition(".")
        found = getattr(importlib.import_module(module), attribute, None)
        assert isinstance(found, type) and issubclass(found, BaseException), f"{dotted}: no such exception type"
        # classify matches a type by its top package and its name, wherever the package defines it
        assert (found.__module__.split(".", 1)[0], found.__name__) == (dotted.split(".", 1)[0], attribute), dotted
        assert failures.classify(made(found)).cls.name == errors.PEER_LOST.name, dotted
    for module in record.peer_modules:
        assert importlib.util.find_spec(module) is not None, f"{module}: no such module"


def made(kind: type[BaseException]) -> BaseException:
    """An instance of ``kind``: with a message, or as TensorFlow's op errors are made (node, op, message)."""
    try:
        return kind("lost")
    except TypeError:
        return kind(None, None, "lost")  # type: ignore[call-arg]
