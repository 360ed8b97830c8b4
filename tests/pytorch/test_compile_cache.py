"""``--compile``'s caches in the job dir (``entrypoint/pytorch/loop/compile_cache.py``, docs/pytorch.md).

In this process, with real cache directories and the real archive (nothing compiled: cheap): the chief writes after
its first step and again when the caches grew at a later epoch's first step, a fresh disk loads them (on a disk and
through gs://), an archive made for another key or a damaged one is one line and never fatal. Then a real job:
``local --workers 2 --recovery restart --compile`` loses its worker after the cache was written; both restarted
replicas, each on a fresh disk, load it, the restarted chief's graphs come from it, and the job ledger shows each
chief attempt's start-up.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.runs import Job, entrypoint, failure_text, replica_group, summary

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.pytorch]

from entrypoint.outputs.storage import Location, RemotePath  # noqa: E402
from entrypoint.pytorch.loop import compile_cache  # noqa: E402
from entrypoint.pytorch.loop.compile_cache import CompileCache  # noqa: E402
from tests.gcs import Emulator, gs_dir  # noqa: E402
from tests.pytorch import compile_hooks  # noqa: E402

LOG = "entrypoint.pytorch"
KERNELS = {"ab/cabc.so": b"a kernel", "fxgraph/x/fgraph/entry": b"a graph", "triton/0/k/k.cubin": b"a gpu kernel"}


def key() -> dict[str, object]:
    model = compile_hooks.build_model(SimpleNamespace(width=4, step_sleep=0.0), None)
    return compile_cache.cache_key(torch.device("cpu"), model, compile_hooks)


def disk(root: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes] | None = None) -> Path:
    """A fresh disk: Inductor's cache directory there (with ``files``)."""
    folder = root / "torchinductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    for name, data in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def step(cache: CompileCache, step: int, epoch: int) -> None:
    cache.after_step(SimpleNamespace(step=step, epoch=epoch))


def marker(folder: Location, digest: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((folder / f"{digest}.json").read_text())
    return data


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG]


def round_trip(folder: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               caplog: pytest.LogCaptureFixture) -> None:
    """The chief writes at its first step and when the caches grew at a later epoch; a fresh disk loads them."""
    caplog.set_level(logging.INFO, LOG)
    first = disk(tmp_path / "first", monkeypatch, {"old/kept-across-jobs.so": b"another job's kernel"})
    os.utime(first / "old" / "kept-across-jobs.so", (time.time() - 3600, time.time() - 3600))
    chief = CompileCache(folder, key(), chief=True, speaks=True)  # before the first step compiles
    disk(tmp_path / "first", monkeypatch, {**KERNELS, "locks/x.lock": b"", "ab/.cabc.so.tmp": b"torn"})
    step(chief, 1, 0)
    assert marker(folder, chief.digest)["step"] == 1 and marker(folder, chief.digest)["key"] == chief.key
    (first / "cd" / "later.so").parent.mkdir()
    (first / "cd" / "later.so").write_bytes(b"an evaluation's kernel")
    step(chief, 2, 0)  # the same epoch: not looked at again
    assert marker(folder, chief.digest)["step"] == 1
    step(chief, 9, 1)  # a later epoch's first step: the caches grew
    assert marker(folder, chief.digest)["step"] == 9
    step(chief, 17, 2)  # nothing new since
    assert marker(folder, chief.digest)["step"] == 9
    CompileCache(folder, key(), chief=False, speaks=False).after_step(SimpleNamespace(step=30, epoch=3))
    assert marker(folder, chief.digest)["step"] == 9  # only the chief writes

    fresh = disk(tmp_path / "fresh", monkeypatch)
    caplog.clear()
    CompileCache(folder, key(), chief=False, speaks=True).load()
    found = {str(p.relative_to(fresh)): p.read_bytes() for p in fresh.rglob("*") if p.is_file()}
    assert found == {**KERNELS, "cd/later.so": b"an evaluation's kernel"}  # no lock, partial file or older file
    (said,) = lines(caplog)
    assert said.startswith(f"compile cache loaded from {folder}/{chief.digest}.tar.gz") and "4 kernel cache" in said


def test_the_chief_keeps_the_caches_and_a_fresh_disk_loads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    round_trip(tmp_path / "job" / "compile_cache", tmp_path, monkeypatch, caplog)


@pytest.mark.slow
def test_through_gs(emulator: Emulator, request: pytest.FixtureRequest, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    folder = RemotePath(f"{gs_dir(request)}/compile_cache")
    round_trip(folder, tmp_path, monkeypatch, caplog)
    assert sorted(p.name for p in folder.iterdir()) == [f"{compile_cache.digest_of(key())}.json",
                                                       f"{compile_cache.digest_of(key())}.tar.gz"]


def test_the_key_is_versions_device_and_model_code() -> None:
    mine = key()
    assert mine["torch"] == torch.__version__ and str(mine["python"]).endswith(".".join(map(str, sys.version_info[:3])))
    assert str(mine["device"]).startswith("cpu ") and mine == key()
    from trainers import gpt_torch

    gpt = gpt_torch.build_model(SimpleNamespace(vocab=8, block=4, width=8, layers=1, heads=2), None)
    assert compile_cache.cache_key(torch.device("cpu"), gpt, compile_hooks)["model_code"] != mine["model_code"]


def test_an_archive_made_for_another_key_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOG)
    folder = tmp_path / "compile_cache"
    folder.mkdir()
    theirs = {**key(), "torch": "2.0.0", "model_code": "0" * 16}
    (folder / f"{compile_cache.digest_of(theirs)}.json").write_text(json.dumps({"key": theirs}))
    (folder / f"{compile_cache.digest_of(theirs)}.tar.gz").write_bytes(b"never read")
    fresh = disk(tmp_path / "fresh", monkeypatch)
    CompileCache(folder, key(), chief=True, speaks=True).load()
    (said,) = lines(caplog)
    assert said == (f"compile cache in {folder} not used: it was made for torch '2.0.0' (here '{torch.__version__}'); "
                    "other model code; torch.compile compiles afresh")
    assert not any(p.is_file() for p in fresh.rglob("*"))
    caplog.clear()
    CompileCache(tmp_path / "none", key(), chief=True, speaks=True).load()
    assert lines(caplog) == [f"no compile cache in {tmp_path / 'none'} yet: torch.compile compiles afresh"]


def archive(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other key inside", "outside the cache", "portable",
                                    "missing"])
def test_a_damaged_archive_is_one_line_and_never_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    caplog.set_level(logging.INFO, LOG)
    folder = tmp_path / "compile_cache"
    cache = CompileCache(folder, key(), chief=True, speaks=True)
    disk(tmp_path / "first", monkeypatch, KERNELS)
    step(cache, 1, 0)
    good = cache.archive.read_bytes()
    own = json.dumps(key(), sort_keys=True).encode()
    damaged = {
        "garbage": b"not an archive",
        "truncated": good[: len(good) // 2],
        "other key inside": archive({"key.json": json.dumps({**key(), "torch": "9"}).encode()}),
        "outside the cache": archive({"key.json": own, "inductor/../../escaped.so": b"x"}),
        "portable": archive({"key.json": own, "portable.bin": b"not torch's"}),
    }
    cache.archive.unlink()
    if damage in damaged:
        cache.archive.write_bytes(damaged[damage])
    fresh = disk(tmp_path / "fresh", monkeypatch)
    caplog.clear()
    CompileCache(folder, key(), chief=False, speaks=True).load()  # raises nothing
    (said,) = lines(caplog)
    how = "unreadable: FileNotFoundError" if damage == "missing" else "damaged: "
    assert said.startswith(f"compile cache {cache.archive} not used ({how}") and \
        said.endswith("); torch.compile compiles afresh"), said
    assert caplog.records[-1].levelno == logging.WARNING
    assert not (tmp_path / "escaped.so").exists() and not (fresh.parent / "escaped.so").exists()


def goodput(job_dir: Path) -> dict:
    proc = entrypoint("goodput", str(job_dir), "--json", timeout=120)
    assert proc.returncode == 0, failure_text(proc)
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_restarted_job_loads_the_cache_on_every_fresh_disk(tmp_path: Path) -> None:
    out = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    job = Job("local", "--workers", "2", "--output-dir", str(out), "--", "run", "--framework", "pytorch",
              "--module", "tests.pytorch.compile_hooks", "--compile", "--recovery", "restart", "--log-every", "1",
              "--checkpoint-every", "2", "--timeout", "120", "--epochs", "2", "--", "--samples", "96",
              "--step-sleep", "0.3", env={**env, "TMPDIR": str(tmp_path)})
    try:
        job.wait_for(r"\[workerpool0-0\] .*compile cache written to .* after step 1 ", timeout=600)
        os.killpg(replica_group(job, "workerpool1-0"), signal.SIGKILL)  # --recovery restart: both restart
        assert job.wait(600) == 0, job.output()[-4000:]
    finally:
        job.cleanup()
    output = job.output()
    for replica in ("workerpool0-0#1", "workerpool1-0#1"):  # each restarted on a fresh disk
        assert re.search(rf"\[{replica}\] .*compile cache loaded from {out}/compile_cache/\w+\.tar\.gz", output), \
            output[-4000:]
    counters = json.loads((out / "model" / "compile_counters.json").read_text())  # the restarted chief's
    assert counters["inductor"].get("fxgraph_cache_hit", 0) >= 1 and not counters["inductor"].get("fxgraph_cache_miss")
    assert counters["aot_autograd"].get("autograd_cache_hit", 0) >= 1 and counters["kernels"], counters
    chief = [a for a in goodput(out)["attempts"] if a["chief"]]
    assert len(chief) == 2 and all(a["startup_seconds"] for a in chief), chief  # measured; compared in bench/
    result = summary(out / "model")  # --compile with DDP reports its compile time (FSDP: tests/pytorch/test_sharded.py)
    assert result["strategy"] == "ddp" and result["details"]["compile_seconds"] > 0, result
