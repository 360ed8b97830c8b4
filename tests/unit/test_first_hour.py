"""What a newcomer's first hour hits (issue 57), each a clear line of the right class: argument mistakes, a framework
this Python lacks, another job's dir, an output dir that cannot be created, where a run's errors say they happened;
and the small things: the commands' help, a module's default tuning metric, local's and goodput's columns.

Real ``python -m entrypoint`` processes where the message is the point (each refused before any framework is
imported: they are cheap), the functions themselves for the rest.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from entrypoint import failures
from entrypoint.errors import ConfigError, ExitCode
from entrypoint.lifecycle.jobdir import jobrecord
from entrypoint.options import RunOptions
from entrypoint.outputs.hypertune import MetricReporter
from entrypoint.outputs.locations import ensure_writable
from entrypoint.planning import registry
from entrypoint.planning.usercode import UserCode
from tests.conftest import PYTHON, ROOT, subprocess_env
from tests.runs import entrypoint

ERROR = "entrypoint: error: "


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command printed (nothing else on either stream), without its ``entrypoint: error:``."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(ERROR), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0].removeprefix(ERROR)


# ---- argument mistakes ---------------------------------------------------------------------------------------------
def test_a_mistyped_option_is_named_with_the_option_it_is_close_to(tmp_path: Path) -> None:
    proc = entrypoint("run", "--framwork", "pytorch", "--module", "trainers.digits_torch", "--job-dir", str(tmp_path))
    assert proc.returncode == ExitCode.CONFIG
    assert one_line(proc) == "run: unknown option --framwork (did you mean --framework?)"
    assert list(tmp_path.iterdir()) == []  # nothing written: not even a failure record


def test_an_argument_for_the_users_code_before_the_dashes_says_where_it_goes() -> None:
    proc = entrypoint("run", "--module", "trainers.digits_torch", "--lr", "0.05", "--api-key", "s3cret-value-42")
    assert proc.returncode == ExitCode.CONFIG
    line = one_line(proc)
    assert line.startswith("run: unknown options --lr, --api-key; arguments for your code go after '--'"), line
    assert "0.05" not in line and "s3cret" not in line  # flags named, never their values


def test_local_without_the_dashes_says_where_the_replica_command_goes(tmp_path: Path) -> None:
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "run", "--framework", "pytorch",
                      "--module", "trainers.digits_torch")
    assert proc.returncode == ExitCode.CONFIG
    line = one_line(proc)  # not argparse's usage dump
    assert line.startswith("local: unknown options --framework, --module; unexpected argument run;"), line
    assert line.endswith("the replica command goes after '--': python -m entrypoint local [options] -- run ...")
    assert list(tmp_path.iterdir()) == []  # no replica started


@pytest.mark.parametrize(("typed", "said"), [
    ("rnu", "unknown command 'rnu': did you mean run?"),
    ("--module", "unknown command '--module': the command comes first: python -m entrypoint run --module ..."),
    ("train", "unknown command 'train': expected one of run, describe, doctor, local, job, goodput, sbom"),
])
def test_a_mistyped_command_gets_one_line_naming_what_was_meant(typed: str, said: str) -> None:
    proc = entrypoint(typed, "trainers.digits_torch")
    assert proc.returncode == ExitCode.CONFIG
    assert one_line(proc) == f"{said} (python -m entrypoint --help says what each does)"


def test_help_says_what_each_command_does() -> None:
    proc = entrypoint("--help")
    assert proc.returncode == ExitCode.OK and proc.stderr == ""
    listed = dict(re.findall(r"^  (\w+)\s+(.+)$", proc.stdout, flags=re.MULTILINE))
    assert list(listed) == ["run", "describe", "doctor", "local", "job", "goodput", "sbom"]
    assert all(len(what) > 30 for what in listed.values()), listed


def test_a_runs_errors_name_its_node_not_local() -> None:
    proc = entrypoint("run", "--framework", "pytorch", "--module", "trainers.no_such_module", "--job-dir",
                      "/nonexistent-i57/job")
    assert proc.returncode == ExitCode.CONFIG
    assert proc.stderr.strip().splitlines()[-1].startswith(f"{ERROR}config on node-0, host "), proc.stderr


# ---- a framework this Python does not have -------------------------------------------------------------------------
def test_a_framework_this_python_lacks_is_a_config_error_saying_where_it_is(tmp_path: Path) -> None:
    missing = [name for name in registry.names() if not registry.get(name).installed() and registry.get(name).image]
    if not missing:
        pytest.skip("every registered framework is installed in this Python")
    name = missing[0]
    proc = entrypoint("run", "--framework", name, "--module", "trainers.digits_torch", "--job-dir", str(tmp_path))
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{ERROR}config on node-0") and "Traceback" not in proc.stderr, proc.stderr
    assert f"--framework: {name} is not installed in this Python ({PYTHON}; installed here: " in last
    assert f"run in the {name} image, or on a checkout in .venv/{name} (make venv-{name}" in last


def test_a_script_runs_as_it_is_with_a_warning_naming_where_its_framework_is(tmp_path: Path) -> None:
    """A script may need nothing of the framework (the launcher only sets its variables: the job specs' round trips
    run a probe script under every framework): it runs, after one warning with the same words."""
    if registry.get("tensorflow").installed():  # its launcher sets TF_CONFIG for a script and imports nothing of it
        pytest.skip("TensorFlow is installed in this Python")
    missing = ["tensorflow"]
    script = tmp_path / "probe.py"
    script.write_text("print('the script ran')\n")
    proc = entrypoint("run", "--framework", missing[0], "--script", str(script), "--job-dir", str(tmp_path / "job"))
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "the script ran" in proc.stdout
    out = proc.stdout + proc.stderr
    warned = [line for line in out.splitlines() if "is not installed in this Python" in line]
    assert len(warned) == 1 and "WARNING" in warned[0] and "the script runs as it is" in warned[0], out


def test_a_plain_interpreter_gets_the_same_line_not_a_traceback(tmp_path: Path) -> None:
    """``python -S``: no site-packages, so no framework at all (a newcomer's system Python)."""
    env = subprocess_env()
    for args, said in [(["--framework", "pytorch"], "--framework: pytorch is not installed in this Python"),
                       ([], "--framework: not given and no framework is installed in this Python")]:
        proc = subprocess.run([PYTHON, "-S", "-m", "entrypoint", "run", *args, "--module", "trainers.digits_torch",
                               "--job-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == ExitCode.CONFIG, proc.stderr
        assert said in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr, proc.stderr


# ---- another job's dir ---------------------------------------------------------------------------------------------
def recorded(job_dir: Path, module: str, framework: str = "pytorch") -> None:
    """A job dir whose job ran ``module``, as its chief records it."""
    jobrecord.start(str(job_dir), RunOptions(module=module), frozenset(), framework, UserCode("hooks", module))


def test_run_on_another_jobs_dir_is_refused_before_anything_runs(tmp_path: Path) -> None:
    job = tmp_path / "job"
    recorded(job, "trainers.digits_torch")
    before = sorted(p.name for p in job.rglob("*"))
    proc = entrypoint("run", "--framework", "pytorch", "--module", "trainers.gpt_torch", "--job-dir", str(job))
    assert proc.returncode == ExitCode.CONFIG
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{ERROR}config on node-0") and f"--job-dir: {job} holds another job: its job.json says " \
        "module trainers.digits_torch, and this run is module trainers.gpt_torch" in line, proc.stderr
    assert "give this run a job dir of its own (--job-dir; local: --output-dir)" in line
    assert proc.stdout == ""  # nothing ran: no fabric step, no outputs line, no doctor
    assert sorted(p.name for p in job.rglob("*")) == before  # not even its failure record: that job's failures/


def test_the_same_job_again_is_no_other_job(tmp_path: Path) -> None:
    recorded(tmp_path, "trainers.digits_torch")
    assert jobrecord.refusal(str(tmp_path), "pytorch", UserCode("hooks", "trainers.digits_torch")) is None
    assert jobrecord.refusal(str(tmp_path / "fresh"), "tensorflow", UserCode("module", "x")) is None


@pytest.mark.parametrize(("framework", "code", "said"), [
    ("tensorflow", UserCode("hooks", "trainers.digits_torch"), "says framework pytorch, and this run is framework "
                                                               "tensorflow, which"),
    ("pytorch", UserCode("script", "train.py"), "says module trainers.digits_torch, and this run is script train.py, "),
    ("tensorflow", UserCode("hooks", "trainers.tabular_keras"), "says framework pytorch, module trainers.digits_torch, "
                                                                "and this run is framework tensorflow, module "
                                                                "trainers.tabular_keras, which"),
])
def test_another_framework_or_code_is_another_job(tmp_path: Path, framework: str, code: UserCode, said: str) -> None:
    recorded(tmp_path, "trainers.digits_torch")
    refused = jobrecord.refusal(str(tmp_path), framework, code)
    assert isinstance(refused, ConfigError) and refused.source == "--job-dir" and said in refused.problem
    assert failures.classify(refused).exit_code == ExitCode.CONFIG


def test_a_record_that_does_not_say_is_no_other_job(tmp_path: Path) -> None:
    """A job.json of before this check recorded --framework as given (none) and no module for $TRAINER_MODULE."""
    (tmp_path / jobrecord.RECORD).write_text(json.dumps({"options": {"framework": None, "module": None,
                                                                      "script": None}, "user_args": {}}))
    assert jobrecord.refusal(str(tmp_path), "tensorflow", UserCode("hooks", "trainers.tabular_keras")) is None
    recorded(tmp_path / "s", "unused")
    (tmp_path / "s" / jobrecord.RECORD).write_text(json.dumps({"options": {"framework": "pytorch", "script":
                                                                            "./train.py"}, "user_args": {}}))
    assert jobrecord.refusal(str(tmp_path / "s"), "pytorch", UserCode("script", "train.py")) is None


def test_local_on_another_jobs_dir_is_refused_before_any_replica_starts(tmp_path: Path) -> None:
    recorded(tmp_path, "trainers.digits_torch")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = entrypoint("local", "--workers", "2", "--output-dir", str(tmp_path), "--", "run", "--framework",
                      "pytorch", "--module", "trainers.gpt_torch")
    assert proc.returncode == ExitCode.CONFIG
    assert one_line(proc).startswith(f"--job-dir: {tmp_path} holds another job: its job.json says module "
                                     "trainers.digits_torch, and this run is module trainers.gpt_torch")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no ledger of local's, no replica's disk output


def test_locals_job_dir_is_the_replica_commands_own_job_dir(tmp_path: Path) -> None:
    """``local -- run --job-dir D``: the records, ledger and outputs all under D (the replicas' AIP_* dirs too), so
    local's last line names the replicas' root cause; another --output-dir beside it is one line, nothing started."""
    proc = subprocess.run([PYTHON, "-m", "entrypoint", "local", "--workers", "2", "--", "run", "--framework",
                           "pytorch", "--module", "trainers.nonexistent", "--job-dir", str(tmp_path / "job")],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == ExitCode.CONFIG
    assert "--module: cannot find module 'trainers.nonexistent'" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]  # no ./outputs beside it
    # the first failure stops the other replica: it may be gone before its own check wrote a record
    assert list((tmp_path / "job" / "failures").glob("*workerpool*.json"))
    proc = entrypoint("local", "--output-dir", str(tmp_path / "other"), "--", "run", "--module", "trainers.x",
                      f"--job-dir={tmp_path / 'job'}")
    assert proc.returncode == ExitCode.CONFIG and not (tmp_path / "other").exists()
    assert one_line(proc).startswith(f"local: --output-dir {tmp_path / 'other'} and the replica command's --job-dir "
                                     f"{tmp_path / 'job'} name two job dirs"), proc.stderr


def test_a_worker_on_another_jobs_shared_dir_refuses_at_once(tmp_path: Path) -> None:
    """Each node checks (a shared job dir shows every node the record): a worker does not wait for its chief."""
    recorded(tmp_path, "trainers.digits_torch")
    spec = {"cluster": {"workerpool0": ["127.0.0.1:9"], "workerpool1": ["127.0.0.1:9"]},
            "task": {"type": "workerpool1", "index": 0}}
    proc = entrypoint("run", "--framework", "pytorch", "--module", "trainers.gpt_torch", "--job-dir", str(tmp_path),
                      "--timeout", "600", env={"CLUSTER_SPEC": json.dumps(spec)}, timeout=60)
    assert proc.returncode == ExitCode.CONFIG
    assert "config on workerpool1-0, host" in proc.stderr and "holds another job" in proc.stderr


# ---- an output dir that cannot be created --------------------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_doctor_and_run_agree_on_an_output_dir_that_cannot_be_created(tmp_path: Path) -> None:
    """/proc takes no directories, whoever asks (root too, whom a permission check alone lets through)."""
    job = "/proc/trainer-i57/job"
    doctor = entrypoint("doctor", "--framework", "pytorch", "--module", "trainers.digits_torch", "--job-dir", job)
    assert doctor.returncode == 73 and re.search(r"^error\s+outputs: job dir /proc/trainer-i57/job", doctor.stdout,
                                                 re.MULTILINE), doctor.stdout
    run = entrypoint("run", "--framework", "pytorch", "--module", "trainers.digits_torch", "--job-dir", job,
                     env={"TMPDIR": str(tmp_path)})
    assert run.returncode == 73, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{ERROR}output_not_writable on node-0") and "Traceback" not in run.stderr, run.stderr
    with pytest.raises(Exception) as info:
        ensure_writable([job])
    assert failures.classify(info.value).exit_code == 73 and "cannot write /proc/trainer-i57/job" in str(info.value)


# ---- the small things ----------------------------------------------------------------------------------------------
def test_a_modules_default_metric_is_written_only_where_something_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hypertune")
    monkeypatch.delenv("CLOUD_ML_HP_METRIC_FILE", raising=False)
    alone = MetricReporter(is_chief=True, trial=None, asked=False)  # one node, no trial, only HYPERTUNE_METRIC
    alone.report("accuracy", 0.9, 10)
    assert alone.path is None
    assert alone.described("accuracy") == "'accuracy' not written (not a tuning trial; --hypertune-metric writes it)"
    metrics = tmp_path / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metrics))  # the platform (or local) names where it reads them
    named = MetricReporter(is_chief=True, trial=None, asked=False)
    named.report("accuracy", 0.9, 10)
    assert metrics.is_file() and named.described("accuracy") == f"'accuracy' in {metrics}"


def test_locals_closing_paths_line_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from entrypoint.lifecycle.supervision.supervisor import Outcome, Replica
    from entrypoint.local.emulator import _report

    env = {"AIP_MODEL_DIR": f"{tmp_path}/model/", "AIP_CHECKPOINT_DIR": f"{tmp_path}/checkpoints/",
           "AIP_TENSORBOARD_LOG_DIR": f"{tmp_path}/logs/"}
    for name in ("model", "checkpoints", "logs"):  # outputs the job wrote (empty directories are not named)
        (tmp_path / name).mkdir()
        (tmp_path / name / "written").touch()
    _report(Outcome(0), [Replica("workerpool0", 0, env)], str(tmp_path), failures.FailureContext(replica="local"))
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\[local\] \w+:\s", line)]
    assert [line.split(":")[0] for line in lines] == [f"[local] {n}" for n in ("model", "checkpoints", "tensorboard",
                                                                               "hypertune")]
    columns = {len(re.match(r"\[local\] \w+:\s+", line).group(0)) for line in lines}  # type: ignore[union-attr]
    assert len(columns) == 1, lines

