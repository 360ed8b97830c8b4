"""The machine tables and sizing rule, and the YAML emitter against PyYAML."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.jobs import machines, yamltext

pytestmark = pytest.mark.jobs


def test_the_guides_sizing_examples() -> None:
    # 8 a2-megagpu-16g workers at 100 Gbps, n1-highcpu-16 reducers at 32 Gbps: 25 reducers.
    per_vm = machines.training_bandwidth("a2-megagpu-16g", ("NVIDIA_TESLA_A100", 16))
    assert per_vm == 100 and machines.reducer_bandwidth("n1-highcpu-16") == 32
    assert machines.reducers_needed(8, per_vm, 32) == 25
    # 5 n1-highmem-96 with 8 V100 each (100 Gbps): 16 reducers.
    v100 = machines.training_bandwidth("n1-highmem-96", ("NVIDIA_TESLA_V100", 8))
    assert v100 == 100 and machines.reducers_needed(5, v100, 32) == 16
    assert machines.reducer_bandwidth("n2-highcpu-16") == 32 and machines.reducer_bandwidth("n1-highcpu-8") == 16
    assert machines.reducer_bandwidth("e2-standard-16") is None


def test_reducer_image_by_region() -> None:
    assert machines.reduction_server_image("us-central1").startswith("us-docker.pkg.dev/vertex-ai-restricted/")
    assert machines.reduction_server_image("europe-west4").startswith("europe-docker.pkg.dev/")
    assert machines.reduction_server_image("asia-east1").startswith("asia-docker.pkg.dev/")
    assert all(machines.is_reduction_server(uri) for uri in machines.REDUCTION_SERVER_IMAGES.values())


def test_accelerator_names_are_the_apis() -> None:
    """Every accelerator type in the tables is a value of aiplatform_v1's AcceleratorType."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    names = {a.name for a in AcceleratorType}
    assert set(machines.ACCELERATOR_TYPES) <= names
    assert {gpu for gpu, _, _ in machines.GPU_MACHINES.values()} | set(machines.N1_GPUS) <= names


def test_accelerator_optimized_types_imply_their_gpus() -> None:
    assert machines.implied_accelerator("a2-highgpu-8g") == ("NVIDIA_TESLA_A100", 8)
    assert machines.implied_accelerator("g2-standard-24") == ("NVIDIA_L4", 2)
    assert machines.implied_accelerator("n1-standard-8") is None


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text(max_size=20))
_keys = st.text(min_size=1, max_size=12)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
                       max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5))
def test_yaml_emitter_round_trips_through_pyyaml(doc: dict[str, Any]) -> None:
    assert yaml.safe_load(yamltext.dump(doc)) == (doc or {})
