"""Fine-tuning a Hugging Face model end to end: a tiny GPT-2 saved with ``save_pretrained`` (an index over several
files, as the hub shards them), trained one epoch under FSDP over 2 processes from ``--init-from`` (each rank
reading its shards), exported as a directory ``AutoModelForCausalLM.from_pretrained`` opens; from a disk and from
``gs://`` on the suite's GCS emulator. transformers is a test dependency only (tests/requirements.txt).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.gcs import BUCKET, Emulator, gs_dir
from tests.runs import entrypoint, failure_text, last_line, summary

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:  # imported in the tests only: it takes seconds
    pytest.skip("transformers is not installed (tests/requirements.txt)", allow_module_level=True)
pytestmark = [pytest.mark.pytorch, pytest.mark.slow]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
HOOKS = ["--framework", "pytorch", "--module", "tests.pytorch.hf_hooks", "--timeout", "120", "--log-every", "1"]


def pretrained(where: Path, n_embd: int = 16) -> Any:
    """A tiny GPT-2 (random weights from a fixed seed) saved as the hub saves models: several files and an index."""
    import transformers

    torch.manual_seed(7)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=n_embd, n_layer=2, n_head=2, vocab_size=64,
                                                                 n_positions=16))
    model.save_pretrained(where, max_shard_size="10KB")
    return model


def fine_tune(init_from: str, config: Path, job_dir: str, env: dict[str, str], *extra: str) -> Any:
    return entrypoint("run", *HOOKS, "--nproc-per-node", "2", "--strategy", "fsdp", "--init-from", init_from,
                      "--job-dir", job_dir, *extra, "--", "--config", str(config), "--lr", "0",
                      env={**OFFLINE, **env}, timeout=600)


def assert_same_weights(exported: Path, model: Any) -> None:
    """``from_pretrained`` opens the export, and with a learning rate of 0 its weights are the pretrained ones."""
    import transformers

    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    want, got = model.state_dict(), loaded.state_dict()
    assert sorted(want) == sorted(got)
    different = [name for name in want if not torch.equal(want[name], got[name])]
    assert not different, different


def test_fsdp_fine_tunes_from_init_from_and_exports_what_from_pretrained_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    model = pretrained(tmp_path / "pretrained")
    assert len(json.loads((tmp_path / "pretrained" / "model.safetensors.index.json").read_text())["weight_map"]) > 1
    job = tmp_path / "job"
    proc = fine_tune(str(tmp_path / "pretrained"), tmp_path / "pretrained", str(job), {})
    assert proc.returncode == 0, failure_text(proc)
    assert "strategy fsdp: --strategy fsdp" in proc.stdout
    assert "first weights from" in proc.stdout and "(--init-from)" in proc.stdout
    exported = job / "model"
    files = sorted(p.name for p in exported.iterdir())
    assert files == ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json", "training_summary.json"]
    index = json.loads((exported / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embedding: saved once, as transformers does
    assert json.loads((exported / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    assert_same_weights(exported, model)
    result = summary(exported)
    assert result["strategy"] == "fsdp" and result["final_step"] == result["expected_steps"] == 2
    assert set(result["metrics"]) == {"loss"}  # no eval_step: the evaluation follows compute_loss (no accuracy)
    assert "from_pretrained" in result["load_with"]

    again = fine_tune(str(tmp_path / "pretrained"), tmp_path / "pretrained", str(job), {})  # the job's own wins
    assert again.returncode == 0, failure_text(again)
    assert "resumed from" in again.stdout and "first weights from" not in again.stdout
    assert_same_weights(exported, model)


def test_init_from_and_the_export_on_cloud_storage(
        emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    model = pretrained(tmp_path / "pretrained")
    prefix = gs_dir(request)
    fs: Any = emulator.fs()
    for file in (tmp_path / "pretrained").iterdir():
        fs.put_file(str(file), f"{BUCKET}/{request.node.name}/pretrained/{file.name}")
    proc = fine_tune(f"{prefix}/pretrained", tmp_path / "pretrained", f"{prefix}/job",
                     {**emulator.env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, failure_text(proc)
    local = tmp_path / "exported"
    local.mkdir()
    for name in fs.ls(f"{BUCKET}/{request.node.name}/job/model", detail=False):
        fs.get_file(name, str(local / Path(name).name))
    assert (local / "model.safetensors.index.json").is_file()
    assert_same_weights(local, model)


def test_a_checkpoint_of_another_shape_is_named_before_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    pretrained(tmp_path / "other", n_embd=8)
    pretrained(tmp_path / "config")
    proc = entrypoint("run", *HOOKS, "--init-from", str(tmp_path / "other"), "--job-dir", str(tmp_path / "job"),
                      "--", "--config", str(tmp_path / "config"), env=OFFLINE, timeout=600)
    assert proc.returncode == 2, failure_text(proc)
    line = last_line(proc)
    assert "--init-from" in line and "transformer.wte.weight is [64, 8] in" in line, line
    assert "training 1 epochs" not in proc.stdout
