"""A small GPT on the GPU: tokens/s and MFU, the bare model vs the entrypoint's loop at world 1.

With CUDA: the nanoGPT-style GPT-2 small of ``bench.gpt`` (124M, block 1024), bf16 autocast and
``torch.compile`` on both sides, fused AdamW; MFU = tokens/s x training FLOPs per token / the GPU's peak
dense bf16 FLOP/s (table below). Without CUDA the same code runs the ``tiny`` config in fp32, eagerly,
and reports no MFU: this is how the GPU path is tested on CPU machines.

Compared: ``python bench/ddp_loop.py`` without a process group (the bare model; anchor), the same loop
as DDP world 1, and ``entrypoint run --module bench.gpt_hooks`` (which runs one process without a process
group). Target: the entrypoint at least 0.98 of the bare model.

Sharded (issue #29): ``entrypoint run --strategy fsdp --bf16 --compile --nproc-per-node N`` over every GPU of
the machine (FSDP2 per block with bf16 parameters and fp32 reductions, each block compiled), tokens/s per GPU
next to the bare model's, and MFU per GPU; goal at least 45% MFU. With one GPU the entrypoint has nothing to
shard and trains that one process unsharded (the row says which strategy ran). Without CUDA: 2 processes on
CPU, the tiny config, fp32 and eager, to check the path runs (full size only: at quick size the memory family
already trains this module under FSDP).

    python -m bench --only gpt          # on a GPU machine
"""

from __future__ import annotations

import re
import shutil
from typing import Any

from bench.common import FamilyResult, Row, check, compare, interleave, median
from bench.loop import Size, hand_loop, hooks_loop

# Peak dense (no sparsity) bf16 tensor-core TFLOP/s from NVIDIA's datasheets (their "with sparsity" figures
# halved); first match wins, so the specific names come before the general ones.
PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 756.0, "https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: 1,513 sparse)"),
    (r"H100 NVL", 835.0, "https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL: 1,671 sparse)"),
    (r"H100|H800|GH200", 989.0, "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 1,979 sparse)"),
    (r"H200", 989.0, "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1,979 sparse)"),
    (r"B200", 2250.0, "https://www.nvidia.com/en-us/data-center/dgx-b200/ (72 PFLOPS FP8 sparse / 8 GPUs)"),
    (r"A100", 312.0, "https://www.nvidia.com/en-us/data-center/a100/ (624 sparse)"),
    (r"L40S", 362.0, "https://www.nvidia.com/en-us/data-center/l40s/ (733 sparse)"),
    (r"\bL4\b", 121.0, "https://www.nvidia.com/en-us/data-center/l4/ (242 sparse)"),
    (r"\bA10\b", 125.0, "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (250 sparse)"),
)


def peak_tflops(device_name: str) -> tuple[float, str] | None:
    """The GPU's peak dense bf16 TFLOP/s and its source, if we know the GPU."""
    for pattern, tflops, source in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return tflops, source
    return None


MFU_GOAL = 45.0  # % for the sharded run (issue #29: a 124M-1B GPT with FSDP, bf16 and torch.compile on an H100)


def mfu_row(name: str, runs: list[dict[str, Any]], peak: float) -> Row:
    """Model FLOPs utilisation of one variant (%, per device), from tokens/s, FLOPs per token and the world size."""
    values = [100.0 * r["tokens_per_second"] * r["flops_per_token"] / (peak * 1e12 * r.get("world_size", 1))
              for r in runs]
    return Row(group="MFU", variant=name, unit="%", runs=[round(v, 2) for v in values], median=round(median(values), 2))


def run(quick: bool) -> FamilyResult:
    """Bare vs entrypoint (and DDP world 1 in the full size), and the sharded run, interleaved."""
    import torch

    cuda = torch.cuda.is_available()
    compiled = cuda and shutil.which("cc") is not None  # inductor builds small C launchers
    if cuda:
        size, repeats = (Size("gpu", 30, 10, 8), 1) if quick else (Size("gpu", 80, 20, 16), 3)
    else:
        size, repeats = (Size("tiny", 20, 5, 8), 1) if quick else (Size("tiny", 60, 10, 8), 2)
    world = torch.cuda.device_count() if cuda else 2
    precision: tuple[str, ...] = ("--bf16",) if cuda else ()
    compile_flag: tuple[str, ...] = ("--compile",) if compiled else ()
    sharded_flags = ("--strategy", "fsdp", *precision, *compile_flag)  # the entrypoint's --compile: per block
    unit = ("GPU" if world == 1 else "GPUs") if cuda else "CPU processes"
    sharded_name = f"entrypoint hooks, {' '.join(sharded_flags)}, {world} {unit}"
    raw: dict[str, list[dict[str, Any]]] = {}

    def keep(name: str, result: dict[str, Any]) -> float:
        raw.setdefault(name, []).append(result)
        return float(result["tokens_per_second"])

    variants = {"bare model (no process group)": lambda: keep("bare", hand_loop(1, size, precision + compile_flag))}
    if not quick:
        variants["hand loop, DDP world 1"] = lambda: keep("ddp", hand_loop(1, size, precision + compile_flag,
                                                                          ddp=True))
    variants["entrypoint hooks, world 1"] = lambda: keep("hooks", hooks_loop(1, size, precision, compile_flag))
    if cuda or not quick:  # on CPU at quick size, the memory family's quick run trains this module under FSDP
        variants[sharded_name] = lambda: keep("sharded", hooks_loop(world, size, sharded_flags))
    results = interleave(variants, repeats)
    result = FamilyResult("gpt", "Small GPT: one device, and sharded over the machine (tokens/s, higher is better)")
    one_device = {name: values for name, values in results.items() if name != sharded_name}
    result.rows = compare("1 device", one_device, "tokens/s", next(iter(variants)), "x bare")
    check(result.rows[-1], ">=", 0.98)
    if "sharded" in raw:
        result.rows.append(sharded_row(sharded_name, raw["sharded"], median(results[next(iter(variants))]), cuda))
    device = str(raw["bare"][0]["device_name"])
    found = peak_tflops(device) if cuda else None
    if found is not None:
        keys = [key for key in ("bare", "ddp", "hooks", "sharded") if key in raw]
        for name, key in zip(variants, keys, strict=True):
            result.rows.append(mfu_row(name, raw[key], found[0]))
        check(result.rows[-1], ">=", MFU_GOAL, against=result.rows[-1].median)
        result.notes.append(f"MFU per device against {found[0]:g} TFLOP/s dense bf16 for {device}: {found[1]}")
    elif cuda:
        result.notes.append(f"no peak known for {device}: MFU not reported (add it to PEAK_BF16_TFLOPS)")
    params = raw["bare"][0]["params"]
    result.notes.append(f"{device}: config '{size.config}' ({params / 1e6:.1f}M parameters), batch {size.batch} "
                        f"per process, {size.steps} steps timed from step {size.warmup}; "
                        f"{'bf16 autocast' if cuda else 'fp32'}, {'torch.compile' if compiled else 'eager'}; "
                        f"{repeats} interleaved repetition(s)")
    if not cuda:
        sharded_note = ("no sharded run at quick size on CPU (the memory family's quick run trains bench.gpt_hooks "
                        "with --strategy fsdp)" if quick else "the FSDP run is 2 processes over gloo sharing the "
                        "cores, so its tokens/s say nothing about GPUs")
        result.notes.append(f"no CUDA here: the tiny config on CPU checks the GPU path runs; no MFU; {sharded_note}")
    return result


def sharded_row(name: str, runs: list[dict[str, Any]], bare: float, cuda: bool) -> Row:
    """The sharded run's tokens/s (all devices), its ratio per device to the bare model, and what ran."""
    values = [float(r["tokens_per_second"]) for r in runs]
    world = int(runs[-1]["world_size"])
    last = runs[-1]
    ran = last.get("strategy", "?")
    note = f"ran as {ran}" + (f" ({last['strategy_reason']})" if ran != "fsdp" else "")
    if cuda and last.get("compile_seconds"):
        note += f"; compiling took {last['compile_seconds']:.0f} s"
    return Row(group=f"sharded, world {world}", variant=name, unit="tokens/s", runs=[round(v, 4) for v in values],
               median=round(median(values), 4), ratio=round(median(values) / world / bare, 4) if bare else None,
               ratio_label="x bare per device", note=note)
