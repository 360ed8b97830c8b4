"""What a node's elastic agent (``run --nproc-per-node N``) imports: torch's elastic launcher and store, not
``torch._dynamo``. Every PyTorch training process pays for ``torch._dynamo`` (torch's own optimizers import it at
their first step: 1.2-1.3 s of CPU); the agent trains nothing and starts once per node, so it must not. A process
of its own imports what the agent imports (``entrypoint/pytorch/launch/node.py`` and what it imports when it starts
its ranks).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, subprocess_env

pytest.importorskip("torch")
pytestmark = pytest.mark.pytorch

AGENT = ("entrypoint.pytorch.launch.node", "entrypoint.pytorch.launch.forkserver",
         "entrypoint.pytorch.launch.membership", "entrypoint.pytorch.launch.restarts",
         "entrypoint.pytorch.launch.nodewatch",
         "entrypoint.pytorch.launch.collectives", "torch.distributed.launcher.api",
         "torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.multiprocessing.errors")
NOT_IN_AGENT = ("torch._dynamo", "torch._inductor", "sympy", "tensorflow", "tensorboard", "sklearn")


def test_the_node_agent_imports_no_compiler() -> None:
    probe = (f"import importlib, sys; [importlib.import_module(m) for m in {AGENT!r}]; "
             f"print([m for m in {NOT_IN_AGENT!r} if m in sys.modules])")
    out = subprocess.run([PYTHON, "-c", probe], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout
