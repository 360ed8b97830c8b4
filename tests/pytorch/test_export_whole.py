"""The export is never torn where readers look: ``model.safetensors`` (and a replicated model's ``model.pt`` and
``state_dict.pt``) is written under a hidden name and renamed over the previous one once whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from entrypoint.pytorch.loop import export  # noqa: E402

pytestmark = pytest.mark.pytorch


def state(value: float) -> dict[str, Any]:
    return {f"layer{i}.weight": torch.full((64, 64), value + i) for i in range(4)}


def test_while_the_export_is_written_the_previous_one_stays_whole(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / export.SAFETENSORS_FILE
    export.write_safetensors(state(1.0), target, writer=True)
    previous = target.read_bytes()
    seen: list[bytes] = []
    append = export._append

    def looking(value: Any, out: Any, writer_rank: int) -> None:  # a reader between two tensors of the rerun's
        seen.append(target.read_bytes())
        append(value, out, writer_rank)

    monkeypatch.setattr(export, "_append", looking)
    export.write_safetensors(state(2.0), target, writer=True)
    assert seen and all(data == previous for data in seen)
    assert float(safetensors_torch.load_file(str(target))["layer0.weight"][0, 0]) == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [export.SAFETENSORS_FILE]


def test_a_failed_export_leaves_the_previous_one_and_no_partial_file(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / export.SAFETENSORS_FILE
    export.write_safetensors(state(1.0), target, writer=True)
    previous = target.read_bytes()
    calls = {"n": 0}
    append = export._append

    def failing(value: Any, out: Any, writer_rank: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        append(value, out, writer_rank)

    monkeypatch.setattr(export, "_append", failing)
    with pytest.raises(OSError, match="No space left on device"):
        export.write_safetensors(state(2.0), target, writer=True)
    assert target.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [export.SAFETENSORS_FILE]


def test_a_replicated_export_renames_each_file_into_place(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    export.export_model(model, tmp_path, None, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model.safetensors", "state_dict.pt"]
    assert sorted(torch.load(tmp_path / "state_dict.pt", weights_only=True)) == ["bias", "weight"]
