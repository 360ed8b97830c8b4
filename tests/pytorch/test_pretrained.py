"""``--init-from`` in one process (entrypoint/pytorch/pretrained.py), the hub's file cut (hub_export.py) and the
evaluation that follows ``compute_loss`` (defaults.py); the sharded path runs in tests/pytorch/test_hf_finetune.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from entrypoint.pytorch.defaults import eval_step_from_loss  # noqa: E402
from entrypoint.pytorch.loop import hub_export, pretrained  # noqa: E402 (needs torch: skipped in the other tiers' venvs)

pytestmark = pytest.mark.pytorch
nn = torch.nn


class Tiny(nn.Module):
    base_model_prefix = "body"

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.Linear(width, 3))
        self.register_buffer("mask", torch.tril(torch.ones(2, 2)), persistent=False)


def test_built_on_meta_then_loaded_whole_equals_the_saved_model_and_keeps_its_buffers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = Tiny()
    safetensors_torch.save_file({k: v.to(torch.bfloat16) if k.endswith("bias") else v
                                 for k, v in saved.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with pretrained.meta_parameters():
        model = Tiny()
    assert pretrained.on_meta(model) and not model.mask.is_meta
    pretrained.materialize(model, torch.device("cpu"))
    read = pretrained.load(model, str(tmp_path))
    assert read == sum(v.numel() * (2 if k.endswith("bias") else 4) for k, v in saved.state_dict().items())
    assert torch.equal(model.body[0].weight, saved.body[0].weight)
    assert torch.equal(model.body[1].bias, saved.body[1].bias.to(torch.bfloat16).float())
    assert torch.equal(model.mask, torch.tril(torch.ones(2, 2)))


def test_names_without_the_base_model_prefix_are_found_and_extra_ones_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved = Tiny()
    state = {k.removeprefix("body."): v for k, v in saved.state_dict().items()}
    safetensors_torch.save_file({**state, "pooler.weight": torch.zeros(1)}, str(tmp_path / "one.safetensors"))
    model = Tiny()
    with caplog.at_level(logging.WARNING, logger="entrypoint.pytorch"):
        pretrained.load(model, str(tmp_path / "one.safetensors"))
    assert torch.equal(model.body[1].weight, saved.body[1].weight)
    assert "1 saved tensor(s) the model does not have, not loaded: pooler.weight" in caplog.text


def test_a_missing_or_mis_shaped_parameter_is_one_configuration_error_naming_it(tmp_path: Path) -> None:
    state = Tiny().state_dict()
    safetensors_torch.save_file({k: v for k, v in state.items() if k != "body.1.bias"},
                                str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"has no tensor body\.1\.bias"):
        pretrained.load(Tiny(), str(tmp_path))
    safetensors_torch.save_file(Tiny(width=5).state_dict(), str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"body\.0\.weight is \[5, 5\] in .* but \[4, 4\] in the model"):
        pretrained.load(Tiny(), str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        pretrained.load(Tiny(), str(tmp_path / "nowhere"))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"has neither model\.safetensors nor model\.safetensors\.index\.json"):
        pretrained.load(Tiny(), str(tmp_path))


def test_the_hub_cuts_files_as_save_pretrained_does_and_writes_a_tied_weight_once() -> None:
    sizes = [("a", 40), ("b", 40), ("c", 100), ("d", 10)]
    assert hub_export.hub_files(sizes, 100) == [["a", "b"], ["c"], ["d"]]
    assert hub_export.file_names(1) == ["model.safetensors"]
    assert hub_export.file_names(2) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]

    class Tied(nn.Module):
        _tied_weights_keys = ("head.weight",)

        def __init__(self) -> None:
            super().__init__()
            self.head, self.embed = nn.Linear(2, 3, bias=False), nn.Embedding(3, 2)
            self.head.weight = self.embed.weight

    assert hub_export.unique_names(Tied()) == ["embed.weight"]
    assert not hub_export.is_pretrained(Tied())


def test_without_eval_step_the_evaluation_follows_compute_loss() -> None:
    model = nn.Linear(2, 3)
    calls: list[int] = []

    def compute_loss(m: nn.Module, batch: object, ctx: object) -> torch.Tensor:
        calls.append(1)
        return torch.tensor(2.0)

    step = eval_step_from_loss(compute_loss)
    tokens = {"input_ids": torch.zeros(5, 7, dtype=torch.long)}
    metrics = step(model, tokens, None)
    assert set(metrics) == {"loss", "count"} and float(metrics["loss"]) == 10.0 and float(metrics["count"]) == 5.0
    assert len(calls) == 1
    pair = (torch.zeros(4, 2), torch.tensor([0, 1, 2, 0]))  # classification's metrics, as before
    assert set(step(model, pair, None)) == {"loss", "count", "accuracy"} and len(calls) == 1
    regression = (torch.zeros(4, 2), torch.zeros(4))
    assert set(step(model, regression, None)) == {"loss", "count"} and len(calls) == 2
