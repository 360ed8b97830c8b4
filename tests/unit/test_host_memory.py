"""The host memory a node can give (``cluster/memory.py``), read from fake /proc/meminfo and cgroup files, and the
peer-snapshot guard's decision on made-up sizes: the node that cannot hold its copies is named."""

from __future__ import annotations

from pathlib import Path

from entrypoint.cluster import memory

GIB = 1 << 30
MEMINFO = "MemTotal:       2097152000 kB\nMemFree:         1000000 kB\nMemAvailable:   {} kB\nBuffers: 1 kB\n"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_memavailable_is_read_in_bytes_and_missing_is_unknown() -> None:
    assert memory.meminfo_available(MEMINFO.format(1024)) == 1024 * 1024
    assert memory.meminfo_available("MemTotal: 5 kB\nMemFree: 3 kB\n") is None  # kernels before 3.14
    assert memory.meminfo_available("") is None


def test_the_cgroup_v2_limit_less_its_working_set_is_the_room(tmp_path: Path) -> None:
    root = write(tmp_path, {"memory.max": f"{64 * GIB}\n", "memory.current": f"{20 * GIB}\n",
                            "memory.stat": f"anon 1\ninactive_file {4 * GIB}\nactive_file 9\n"})
    assert memory.cgroup_room(root) == (48 * GIB, "the cgroup v2 limit")  # the inactive page cache counts as free
    (root / "memory.max").write_text("max\n")
    assert memory.cgroup_room(root) is None  # no limit set


def test_the_cgroup_v1_limit_and_its_no_limit_value(tmp_path: Path) -> None:
    root = write(tmp_path, {"memory/memory.limit_in_bytes": f"{32 * GIB}", "memory/memory.usage_in_bytes": f"{8 * GIB}",
                            "memory/memory.stat": f"cache 5\ntotal_inactive_file {2 * GIB}\n"})
    assert memory.cgroup_room(root) == (26 * GIB, "the cgroup v1 limit")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")
    assert memory.cgroup_room(root) is None
    assert memory.cgroup_room(tmp_path / "none") is None  # no cgroup files at all


def test_available_is_the_smaller_of_the_host_and_the_container(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO.format(100 * GIB // 1024))
    cgroup = write(tmp_path / "cg", {"memory.max": str(64 * GIB), "memory.current": str(4 * GIB)})
    assert memory.available(meminfo, cgroup) == memory.HostMemory(60 * GIB, "the cgroup v2 limit")
    assert memory.available(meminfo, tmp_path / "no-cgroup") == memory.HostMemory(100 * GIB, "MemAvailable")
    (cgroup / "memory.max").write_text(str(1000 * GIB))
    assert memory.available(meminfo, cgroup).source == "MemAvailable"
    assert memory.available(tmp_path / "no-proc", tmp_path / "no-cgroup").available is None


def test_a_node_that_cannot_hold_its_copies_within_half_of_its_memory_is_named() -> None:
    # 70B parameters over 16 ranks, 8 per node: ~52 GiB of shards and Adam state per rank
    state = 70 * 10**9 * memory.BYTES_PER_PARAMETER // 16
    ranks = [("node-a", state, 1800 * GIB)] * 8 + [("node-b", state, 1800 * GIB)] * 8
    needs = memory.node_needs(ranks)
    assert [(n.node, n.ranks, n.need) for n in needs] == [("node-a", 8, 8 * state * memory.COPIES),
                                                           ("node-b", 8, 8 * state * memory.COPIES)]
    short = memory.short_node(needs)
    assert short is not None and short.node == "node-a" and not short.fits
    assert short.text().startswith("node-a: 8 ranks with 391.2 GiB of shards and optimizer state x 5 copies = ")
    # a smaller model fits; exactly half of what a node gives still fits, a byte more does not
    assert memory.short_node(memory.node_needs([("node-a", GIB, 100 * GIB)] * 2)) is None
    half = memory.NodeNeed("n", 1, 10, 50, 100)
    assert half.fits and not memory.NodeNeed("n", 1, 10, 51, 100).fits
    # the node whose memory one of its ranks read lowest is judged by it; unknown memory is not judged
    assert memory.node_needs([("n", 1, 10), ("n", 1, 4)])[0].available == 4
    assert memory.short_node(memory.node_needs([("n", 10 * GIB, None)])) is None
    # the worse of two short nodes (its need against what it gives) is the one named
    worst = memory.short_node(memory.node_needs([("a", 10 * GIB, 60 * GIB), ("b", 10 * GIB, 20 * GIB)]))
    assert worst is not None and worst.node == "b"


def test_the_parameters_whose_copies_fit_a_node() -> None:
    # 1.8 TiB, 8 of 16 ranks: 5 copies x 12 bytes / 16 x 8 = 30 bytes a parameter, within half: ~32.9 B parameters
    assert memory.parameters_that_fit(1800 * GIB, 16, 8) == int(0.5 * 1800 * GIB / 30)
    assert memory.parameters_that_fit(0, 16, 8) == 0
