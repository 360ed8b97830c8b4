"""Model FLOPs utilisation on one GPU: the entrypoint's loop beside a hand-written loop, with and without compile.

    python -m bench.gpu_mfu --config 700m --out /tmp/mfu.json     # on a GPU machine (bench/gpu_check.sh, step 9)

One process, the ``bench.gpt`` GPT at ``--config``, bf16 on CUDA, in this order (compiled first, so the hooks
loop's compile of the same graph finds inductor's cache, ``TORCHINDUCTOR_CACHE_DIR``, warm):

- ``hand loop, bf16 autocast, compiled``: ``bench/ddp_loop.py --bf16 --compile`` (no process group: the anchor);
- ``entrypoint --strategy fsdp --bf16 --compile``: ``entrypoint run --module bench.gpt_hooks`` with those flags.
  One process has nothing to shard, so the entrypoint trains it as ``default`` (the row says what ran);
- ``hand loop, the entrypoint's FSDP2 sharding, bf16, compiled per block``: ``bench/ddp_loop.py --shard`` at world
  1 over nccl: the sharded path the entrypoint takes from two processes on (its ``parallel.Sharded``: bf16
  parameters, fp32 reductions, each block compiled), timed without the entrypoint's loop;
- the first two again without ``--compile``.

MFU = tokens/s x training FLOPs per token (``GPT.flops_per_token``: 6N + attention) / peak, against two peaks:
the datasheet's dense bf16 (``bench.gpu.peak_tflops``) and the bf16 matrix product measured here at the start
(8192 x 8192 x 8192, random data, the mean of 10 after 3 warm-ups): the ceiling this GPU really reaches.
Every variant has its own ``--timeout``; a variant that fails or times out is recorded with its error, and
``--out`` is rewritten after each, so a run cut short keeps what it measured. Without CUDA the same code runs on
CPU in fp32 (how it is tested off a GPU), with no MFU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.loop import Size, hand_loop, hooks_loop

ANCHOR = "hand loop, bf16 autocast, compiled"


def matmul_tflops(n: int = 8192, warmup: int = 3, timed: int = 10) -> float:
    """The bf16 matrix product's TFLOP/s on this GPU (random data; CUDA events around ``timed`` products)."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(warmup):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(timed):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * timed / (start.elapsed_time(end) / 1e3) / 1e12


def variants(size: Size, cuda: bool, timeout: float) -> dict[str, Callable[[], dict[str, Any]]]:
    """What is measured, in the order it runs."""
    bf16 = ("--bf16",) if cuda else ()
    fsdp = ("--strategy", "fsdp", *bf16)
    return {
        ANCHOR: lambda: hand_loop(1, size, (*bf16, "--compile"), timeout=timeout),
        "entrypoint --strategy fsdp --bf16 --compile": lambda: hooks_loop(1, size, (*fsdp, "--compile"),
                                                                          timeout=timeout),
        "hand loop, the entrypoint's FSDP2 sharding, bf16, compiled per block":
            lambda: hand_loop(1, size, (*bf16, "--compile", "--shard"), ddp=True, timeout=timeout),
        "hand loop, bf16 autocast, eager": lambda: hand_loop(1, size, bf16, timeout=timeout),
        "entrypoint --strategy fsdp --bf16": lambda: hooks_loop(1, size, fsdp, timeout=timeout),
    }


def mfu(result: dict[str, Any], peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation in % of ``peak_tflops`` (per device)."""
    if not peak_tflops or "tokens_per_second" not in result:
        return None
    flops = result["tokens_per_second"] * result["flops_per_token"] / result.get("world_size", 1)
    return round(100.0 * flops / (peak_tflops * 1e12), 2)


def main() -> None:
    """Measure the peak, then every variant, writing ``--out`` after each."""
    import torch

    from bench.gpu import peak_tflops

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="700m")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=180, help="seconds each variant may take")
    parser.add_argument("--only", help="comma-separated variant numbers (1-based), e.g. 1,2")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    size = Size(args.config, args.steps, args.warmup, args.batch)
    report: dict[str, Any] = {"config": args.config, "batch": args.batch, "steps": args.steps,
                              "warmup": args.warmup, "cuda": cuda, "variants": {}}
    if cuda:
        name = torch.cuda.get_device_name()
        datasheet = peak_tflops(name)
        report.update(device_name=name, measured_peak_tflops=round(matmul_tflops(), 1),
                      datasheet_peak_tflops=datasheet[0] if datasheet else None,
                      datasheet_source=datasheet[1] if datasheet else None)
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1))
    chosen = [int(i) for i in args.only.split(",")] if args.only else None
    for number, (label, measure) in enumerate(variants(size, cuda, args.timeout).items(), start=1):
        if chosen is not None and number not in chosen:
            continue
        started = time.perf_counter()
        try:
            found = measure()
        except Exception as exc:  # recorded, and the next variant runs
            found = {"error": " ".join(str(exc).split())[-1500:]}
        found["wall_seconds"] = round(time.perf_counter() - started, 1)
        found["mfu_datasheet"] = mfu(found, report.get("datasheet_peak_tflops"))
        found["mfu_measured_peak"] = mfu(found, report.get("measured_peak_tflops"))
        report["variants"][label] = found
        anchor = report["variants"].get(ANCHOR, {}).get("tokens_per_second")
        if anchor and "tokens_per_second" in found:
            found["x_anchor"] = round(found["tokens_per_second"] / anchor, 4)
        print(f"{label}: " + (f"{found['tokens_per_second']:.0f} tokens/s, MFU {found['mfu_datasheet']}% of the "
                              f"datasheet, {found['mfu_measured_peak']}% of the measured peak"
                              if "tokens_per_second" in found else f"failed: {found['error'][-400:]}")
              + f" ({found['wall_seconds']} s)", flush=True)
        out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
