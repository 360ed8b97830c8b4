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


# issue 32: what the API refuses in a study, and the study's options (early stopping, measurement, conditions,
# several metrics), read back by aiplatform_v1's types and the SDK
@pytest.mark.parametrize(("extra", "expected"), [
    (["--hypertune-metric", "val acc"], "--hypertune-metric: a metric id must not contain whitespace"),
    (["--param-discrete", "b=0,1,2:log"], "a log scale needs every value > 0"),
    (["--param-discrete", "b=1,2:reverse-log", "--param-discrete", "c=-1,2:log"], "c: a log scale"),
    (["--metric", "loss=lowest"], "expected ID=maximize or ID=minimize"),
    (["--metric", "accuracy=minimize"], "metric ids must be unique"),
    (["--metric", "a b=minimize"], "--metric: a metric id must not contain whitespace"),
    (["--param-condition", "lr=optimizer:rmsprop"], "--param-condition: lr: a value is not one of optimizer's"),
    (["--param-condition", "lr=batch:48"], "not one of batch's values"),
    (["--param-condition", "lr=layers:9"], "not a whole number in layers's range"),
    (["--param-condition", "lr=optimizer:adam", "--param-condition", "optimizer=layers:1,2", "--param-condition",
      "layers=lr:1"], "its parent lr is a double"),
    (["--param-condition", "layers=optimizer:adam", "--param-condition", "optimizer=layers:1"], "in a circle"),
    (["--param-condition", "momentum=optimizer:sgd"], "both parameters given with --param-*"),
    (["--early-stopping", "patience"], "expected one of decay-curve, median, convex"),
    (["--early-stopping", "median:max-steps=9"], "max-steps: not an option of median"),
    (["--early-stopping", "convex:min-steps=10,max-steps=5"], "min-steps must not exceed max-steps"),
    (["--early-stopping", "convex:learning-rate-parameter=eta"], "not one of the study's parameters"),
])
def test_invalid_study_options(capsys: pytest.CaptureFixture[str], extra: list[str], expected: str) -> None:
    code, _, err = job(capsys, "vertex-tuning", "--image", TORCH_IMAGE, *STUDY, *extra, "--", "--module", "m")
    assert expected in one_line_error(code, err)


CONDITIONAL = ["--param-double", "momentum=0:0.99", "--param-condition", "momentum=optimizer:sgd",
               "--param-categorical", "schedule=cosine,step", "--param-condition", "schedule=optimizer:sgd",
               "--param-double", "gamma=0.1:0.9", "--param-condition", "gamma=schedule:step",
               "--param-int", "warmup=0:100", "--param-condition", "warmup=layers:3,4",
               "--param-double", "eps=0.1:0.2", "--param-condition", "eps=batch:64,128"]


def test_conditional_parameters_nest_under_their_parents(capsys: pytest.CaptureFixture[str]) -> None:
    """--param-condition: the child hangs under its parent's conditionalParameterSpecs, typed by the parent's kind,
    nested as deep as the conditions go."""
    out, _ = _render(capsys, "json", *CONDITIONAL)
    study = _parsed(out).study_spec
    params = {p.parameter_id: p for p in study.parameters}
    assert set(params) == {"lr", "layers", "optimizer", "batch"}  # the children are not top level
    momentum, schedule = params["optimizer"].conditional_parameter_specs
    assert [list(c.parent_categorical_values.values) for c in (momentum, schedule)] == [["sgd"], ["sgd"]]
    assert (momentum.parameter_spec.parameter_id, schedule.parameter_spec.parameter_id) == ("momentum", "schedule")
    (gamma,) = schedule.parameter_spec.conditional_parameter_specs
    assert list(gamma.parent_categorical_values.values) == ["step"] and gamma.parameter_spec.parameter_id == "gamma"
    (warm,) = params["layers"].conditional_parameter_specs
    assert list(warm.parent_int_values.values) == [3, 4] and warm.parameter_spec.parameter_id == "warmup"
    (eps,) = params["batch"].conditional_parameter_specs
    assert list(eps.parent_discrete_values.values) == [64, 128] and eps.parameter_spec.parameter_id == "eps"


def test_early_stopping_measurement_and_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    """Each stopping rule, the measurement that counts (written in every format), several metrics: aiplatform_v1."""
    out, _ = _render(capsys, "json")
    assert _parsed(out).study_spec.measurement_selection_type.name == "LAST_MEASUREMENT"  # the API's, written
    for option, field, check in (
            ("decay-curve:elapsed", "decay_curve_stopping_spec", lambda s: s.use_elapsed_duration),
            ("median", "median_automated_stopping_spec", lambda s: not s.use_elapsed_duration),
            ("convex:max-steps=1000,min-steps=100,min-measurements=5,learning-rate-parameter=lr,update-all-stopped",
             "convex_automated_stopping_spec", lambda s: (s.max_step_count, s.min_step_count, s.min_measurement_count,
                                                          s.learning_rate_parameter_name, s.update_all_stopped_trials)
             == (1000, 100, 5, "lr", True))):
        out, _ = _render(capsys, "json", "--early-stopping", option, "--measurement", "best")
        study = _parsed(out).study_spec
        assert study._pb.WhichOneof("automated_stopping_spec") == field and check(getattr(study, field))
        assert study.measurement_selection_type.name == "BEST_MEASUREMENT"
    out, err = _render(capsys, "json", "--metric", "latency=minimize")
    assert [(m.metric_id, m.goal.name) for m in _parsed(out).study_spec.metrics] == [
        ("accuracy", "MAXIMIZE"), ("latency", "MINIMIZE")]
    assert "--metric latency: run reports --hypertune-metric only" in err


def test_gcloud_config_header_carries_the_trial_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """gcloud up to 415.0.0 overwrites the file's counts with its flags' default, 1: the command line says them."""
    out, _ = _render(capsys, "gcloud-config", "--early-stopping", "median")
    first = out.splitlines()[0]
    assert "--max-trial-count=12" in first and "--parallel-trial-count=3" in first
    assert yaml.safe_load(out)["studySpec"]["medianAutomatedStoppingSpec"] == {}


def test_gcloud_config_of_tuning_jobs_and_new_trial_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """hp-tuning-jobs decodes its --config with the track's messages: lustreMounts in neither (refused),
    pscInterfaceConfig in beta's (the command says gcloud beta)."""
    net = ["--network", "projects/1/global/networks/n"]
    code, _, err = job(capsys, "vertex-tuning", *OPTIONS, *net, "--lustre-mount", "10.0.0.3:h:lfs:s", "--format",
                       "gcloud-config", "--", "--module", "m")
    assert "refuses lustreMounts in its --config" in one_line_error(code, err)
    out, _ = _render(capsys, "gcloud-config", "--psc-network-attachment", "att")
    assert out.startswith("# gcloud beta ai hp-tuning-jobs create ")
    _parsed(json.dumps({"displayName": "x", **yaml.safe_load(out)}))


def test_python_creates_conditions_metrics_and_measurement(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's own specs (conditional_parameter_spec, parent_values, metric_spec, measurement_selection) create the
    JSON format's study; early stopping, which the SDK cannot take, is refused in one line."""
    extra = [*CONDITIONAL, "--metric", "latency=minimize", "--measurement", "best", "--enable-dashboard-access",
             "--experiment", "my-exp", "--experiment-run", "r1", "--project", "my-project"]
    out, _ = _render(capsys, "python", *extra)
    (made,) = run_python_script(out, monkeypatch, "create_hyperparameter_tuning_job", "hyperparameter_tuning_job")
    expected = _parsed(_render(capsys, "json", *extra)[0])

    def canonical(parameters: Any) -> list[Any]:
        return sorted((type(p).to_json(p) for p in parameters), key=str)

    assert made.study_spec.metrics == expected.study_spec.metrics
    assert canonical(made.study_spec.parameters) == canonical(expected.study_spec.parameters)
    assert made.study_spec.measurement_selection_type.name == "BEST_MEASUREMENT"
    assert made.trial_job_spec == expected.trial_job_spec  # the Experiment and dashboard set on the trial's spec
    assert made.trial_job_spec.experiment_run.endswith("/contexts/my-exp-r1")
    code, _, err = job(capsys, "vertex-tuning", *OPTIONS, "--early-stopping", "median", "--format", "python", "--",
                       "--module", "m")
    assert "takes no early stopping rule" in one_line_error(code, err)


def test_python_without_a_base_output_dir_has_none(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK makes up a base output directory under the staging bucket; the script takes it out, as json has none."""
    options = [o for o in OPTIONS if o not in ("--base-output-dir", "gs://b/tune")]
    code, out, err = job(capsys, "vertex-tuning", *options, "--format", "python", "--", "--module", "m")
    assert code == 0, err
    (made,) = run_python_script(out, monkeypatch, "create_hyperparameter_tuning_job", "hyperparameter_tuning_job")
    assert not made.trial_job_spec.base_output_directory.output_uri_prefix
    code, rest, _ = job(capsys, "vertex-tuning", *options, "--", "--module", "m")
    assert made.trial_job_spec == _parsed(rest).trial_job_spec
