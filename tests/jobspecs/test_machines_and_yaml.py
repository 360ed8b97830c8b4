"""The machine and network tables, the sizing rule, the spec field tables, and the YAML emitter against PyYAML."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.jobs import machines, network, specdoc, yamltext
from tests.conftest import ROOT

pytestmark = pytest.mark.jobs


def test_the_guides_sizing_examples() -> None:
    # 8 a2-megagpu-16g workers at 100 Gbps, n1-highcpu-16 reducers at 32 Gbps: 25 reducers.
    per_vm = network.training_bandwidth("a2-megagpu-16g", ("NVIDIA_TESLA_A100", 16))
    assert per_vm == 100 and network.reducer_bandwidth("n1-highcpu-16") == 32
    assert network.reducers_needed(8, per_vm, 32) == 25
    # 5 n1-highmem-96 with 8 V100 each (100 Gbps): 16 reducers.
    v100 = network.training_bandwidth("n1-highmem-96", ("NVIDIA_TESLA_V100", 8))
    assert v100 == 100 and network.reducers_needed(5, v100, 32) == 16
    assert network.reducer_bandwidth("n2-highcpu-16") == 32 and network.reducer_bandwidth("n1-highcpu-8") == 16
    assert network.reducer_bandwidth("e2-standard-16") is None


def test_reducers_reach_the_general_purpose_nics_only() -> None:
    """A3 High/Mega: one 200 Gbps NIC of 5 / 9; A3 Ultra and A4: 400 Gbps of gVNIC beside 3,200 of CX-7."""
    general = {m: network.training_bandwidth(m, None) for m in ("a3-highgpu-8g", "a3-megagpu-8g",
                                                                 "a3-ultragpu-8g", "a4-highgpu-8g")}
    assert general == {"a3-highgpu-8g": 200, "a3-megagpu-8g": 200, "a3-ultragpu-8g": 400, "a4-highgpu-8g": 400}
    assert network.reducers_needed(8, general["a4-highgpu-8g"], 32) == 100  # not 900 at 3,600 Gbps
    # N1 with P100/P4 is an N1 without GPUs: 2 Gbps per vCPU, at most 32
    assert network.training_bandwidth("n1-standard-8", ("NVIDIA_TESLA_P100", 1)) == 16
    assert network.training_bandwidth("n1-standard-32", ("NVIDIA_TESLA_P4", 2)) == 32
    assert network.training_bandwidth("n1-standard-8", ("NVIDIA_TESLA_T4", 1)) is None  # depends: give a count
    assert set(network.GPU_MACHINE_BANDWIDTH) == set(machines.GPU_MACHINES)


def test_images_md_reduction_server_example_is_sized_by_the_rule() -> None:
    """docs/images.md's gcloud example: 4 a2-highgpu-8g VMs at 100 Gbps need ceil(400 / 32) = 13 reducers."""
    text = (ROOT / "docs" / "images.md").read_text()
    example = text[text.index("### Reduction Server"):text.index("## Use your own trainer")]
    pools = re.findall(r"--worker-pool-spec=machine-type=([\w-]+),replica-count=(\d+)", example)
    (chief, workers, reducers) = pools
    vms = int(chief[1]) + int(workers[1])
    per_vm = network.training_bandwidth(chief[0], machines.implied_accelerator(chief[0]))
    assert per_vm is not None
    assert int(reducers[1]) == network.reducers_needed(vms, per_vm, network.reducer_bandwidth(reducers[0]) or 0)


def test_reducer_image_by_region() -> None:
    assert network.reduction_server_image("us-central1").startswith("us-docker.pkg.dev/vertex-ai-restricted/")
    assert network.reduction_server_image("europe-west4").startswith("europe-docker.pkg.dev/")
    assert network.reduction_server_image("asia-east1").startswith("asia-docker.pkg.dev/")
    assert all(network.is_reduction_server(uri) for uri in network.REDUCTION_SERVER_IMAGES.values())


def test_which_images_carry_the_plugin() -> None:
    assert network.carries_plugin("r/p/t/pytorch:v0.1.0-rs") and network.carries_plugin("r/p/t/pytorch-rs:v1")
    assert not network.carries_plugin("r/p/t/pytorch:v1") and not network.carries_plugin("r/p/t/pytorch-cpu:v1-rs")
    assert not network.carries_plugin("r/p/t/cars:v1")


def test_accelerator_names_are_the_apis() -> None:
    """Every accelerator type in the tables is a value of aiplatform_v1's AcceleratorType."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    names = {a.name for a in AcceleratorType}
    assert set(machines.ACCELERATOR_TYPES) <= names
    assert {gpu for gpu, _ in machines.GPU_MACHINES.values()} | set(machines.N1_GPUS) <= names
    assert set(machines.COMPUTE_CAPABILITY) == {a for a in machines.ACCELERATOR_TYPES if a.startswith("NVIDIA")}


def test_spec_field_tables_are_the_apis() -> None:
    """The fields local --spec accepts per message are aiplatform_v1's, exactly."""
    import re as regex

    from google.cloud.aiplatform_v1 import types

    for message, fields in specdoc.FIELDS.items():
        api = [regex.sub(r"_([a-z])", lambda m: m[1].upper(), f) for f in getattr(types, message).meta.fields]
        assert sorted(fields) == sorted(api), message


def test_machine_type_names() -> None:
    custom = machines.parse_machine_type("n2-custom-8-16384")
    assert (custom.family, custom.vcpus, custom.custom, custom.memory_mb) == ("n2", 8, True, 16384)
    assert machines.parse_machine_type("custom-4-8192-ext").family == "n1"
    assert machines.vcpus("n1-highcpu-16") == 16 and machines.vcpus("a2-highgpu-8g") is None
    assert machines.check_machine_type("f", "c2-standard-60") == []
    assert machines.accelerator_name("NVIDIA_L4", "f") == "NVIDIA_L4"


def test_accelerator_optimized_types_imply_their_gpus() -> None:
    assert machines.implied_accelerator("a2-highgpu-8g") == ("NVIDIA_TESLA_A100", 8)
    assert machines.implied_accelerator("g2-standard-24") == ("NVIDIA_L4", 2)
    assert machines.implied_accelerator("a4-highgpu-8g") == ("NVIDIA_B200", 8)
    assert machines.implied_accelerator("n1-standard-8") is None


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text(max_size=20))
_keys = st.text(min_size=1, max_size=12)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
                       max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5))
def test_yaml_emitter_round_trips_through_pyyaml(doc: dict[str, Any]) -> None:
    assert yaml.safe_load(yamltext.dump(doc)) == (doc or {})
