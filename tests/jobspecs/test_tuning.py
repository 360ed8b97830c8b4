"""``job vertex-tuning``: HyperparameterTuningJobs read back by google-cloud-aiplatform's own types and SDK."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.jobspecs.helpers import TF_IMAGE, TORCH_IMAGE, job, one_line_error, run_python_script

pytestmark = pytest.mark.jobs

STUDY = ["--hypertune-metric", "accuracy", "--goal", "maximize", "--param-double", "lr=0.0001:0.1:log",
         "--param-int", "layers=1:4", "--param-categorical", "optimizer=adam,sgd", "--param-discrete",
         "batch=32,64,128", "--max-trials", "12", "--parallel-trials", "3", "--max-failed-trials", "2"]
OPTIONS = ["--image", TORCH_IMAGE, "--workers", "2", "--base-output-dir", "gs://b/tune", "--labels", "team=ml",
           "--spot", "--service-account", "sa@p.iam.gserviceaccount.com", *STUDY]


def _render(capsys: pytest.CaptureFixture[str], fmt: str, *extra: str) -> tuple[str, str]:
    code, out, err = job(capsys, "vertex-tuning", *OPTIONS, *extra, "--format", fmt, "--", "--module",
                         "trainers.digits_torch", "--epochs", "2")
    assert code == 0, err
    return out, err


def _parsed(text: str) -> Any:
    from google.cloud.aiplatform_v1.types import HyperparameterTuningJob

    return HyperparameterTuningJob.from_json(text)  # strict: unknown fields are an error


def test_json_is_a_tuning_job_the_api_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _render(capsys, "json")
    tuning = _parsed(out)
    assert (tuning.max_trial_count, tuning.parallel_trial_count, tuning.max_failed_trial_count) == (12, 3, 2)
    (metric,) = tuning.study_spec.metrics
    assert (metric.metric_id, metric.goal.name) == ("accuracy", "MAXIMIZE")
    params = {p.parameter_id: p for p in tuning.study_spec.parameters}
    assert (params["lr"].double_value_spec.min_value, params["lr"].scale_type.name) == (0.0001, "UNIT_LOG_SCALE")
    assert (params["layers"].integer_value_spec.min_value, params["layers"].integer_value_spec.max_value) == (1, 4)
    assert list(params["optimizer"].categorical_value_spec.values) == ["adam", "sgd"]
    assert list(params["batch"].discrete_value_spec.values) == [32, 64, 128]
    assert tuning.study_spec.algorithm.name == "ALGORITHM_UNSPECIFIED"  # Vertex's Bayesian optimization
    trial = tuning.trial_job_spec
    assert [p.replica_count for p in trial.worker_pool_specs] == [1, 1]
    assert trial.scheduling.strategy.name == "SPOT" and trial.service_account.startswith("sa@")
    assert trial.base_output_directory.output_uri_prefix == "gs://b/tune"
    assert dict(tuning.labels) == {"team": "ml"}
    # run reports the study's metric; the args end with '--' for the values Vertex appends
    assert list(trial.worker_pool_specs[0].container_spec.args) == [
        "--module", "trainers.digits_torch", "--epochs", "2", "--hypertune-metric", "accuracy", "--"]
    assert "--hypertune-metric accuracy added" in err and "args end with '--'" in err


def test_gcloud_config_is_the_json_job(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _render(capsys, "gcloud-config")
    first = out.splitlines()[0]
    assert first.startswith("# gcloud ai hp-tuning-jobs create ") and "--labels=team=ml" in first
    doc = yaml.safe_load(out)
    rest = json.loads(_render(capsys, "json")[0])
    assert doc == {k: v for k, v in rest.items() if k not in ("displayName", "labels")}
    _parsed(json.dumps({"displayName": "x", **doc}))


def test_python_creates_the_same_tuning_job(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The script runs with the real SDK (credentials faked, the API call caught): it creates the JSON job."""
    out, _ = _render(capsys, "python", "--algorithm", "random")
    (made,) = run_python_script(out, monkeypatch, "create_hyperparameter_tuning_job", "hyperparameter_tuning_job")
    expected = _parsed(_render(capsys, "json", "--algorithm", "random")[0])
    assert made.study_spec.metrics == expected.study_spec.metrics
    assert sorted(made.study_spec.parameters, key=lambda p: p.parameter_id) == sorted(
        expected.study_spec.parameters, key=lambda p: p.parameter_id)
    assert made.study_spec.algorithm.name == "RANDOM_SEARCH"
    assert (made.max_trial_count, made.parallel_trial_count, made.max_failed_trial_count) == (12, 3, 2)
    assert made.trial_job_spec == expected.trial_job_spec
    assert dict(made.labels) == {"team": "ml"}


def test_tensorflow_reducers_and_metric_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = job(capsys, "vertex-tuning", "--image", TF_IMAGE, *STUDY, "--", "--module", "m",
                         "--hypertune-metric", "accuracy", "--", "--units", "8")
    assert code == 0, err
    args = list(_parsed(out).trial_job_spec.worker_pool_specs[0].container_spec.args)
    assert args == ["--module", "m", "--hypertune-metric", "accuracy", "--", "--units", "8"]


@pytest.mark.parametrize(("extra", "run", "expected"), [
    (["--param-double", "lr=1:0.1"], [], "MIN must be below MAX"),
    (["--param-double", "lr=0:1:log"], [], "log scale needs MIN > 0"),
    (["--param-int", "n=1.5:3"], [], "whole numbers"),
    (["--param-discrete", "b=64,32"], [], "increasing order"),
    (["--param-categorical", "o=a,a"], [], "distinct values"),
    (["--param-int", "lr=1:3"], [], "more than once"),
    (["--algorithm", "grid"], [], "grid search takes integer, categorical and discrete"),
    (["--parallel-trials", "20"], [], "--parallel-trials <= --max-trials"),
    ([], ["--hypertune-metric", "loss"], "differs from the run args"),
    (["--param-double", "9lives=0:1"], [], "expected ID="),
])
def test_invalid_study(capsys: pytest.CaptureFixture[str], extra: list[str], run: list[str], expected: str) -> None:
    code, _, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, *STUDY, *extra, "--", "--module", "m", *run)
    assert expected in one_line_error(code, err)


def test_a_parameter_named_like_a_run_option_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, "--hypertune-metric", "acc", "--goal",
                       "minimize", "--param-int", "epochs=1:5", "--max-trials", "4", "--", "--module", "m")
    assert code == 0 and "parameter epochs: Vertex AI appends --epochs=VALUE after the args' '--'" in err
