"""The failure table as ``failures.classify`` applies it: one row per kind of exception, its class and exit code.

test_classify.py has the first rows (and the output-permission cases run as another user); this table
documents the rest of the mapping in ``classify``, ``_os_failure``, ``_storage_failure``, ``code_class`` and
``errors.sys_exit_code``. Nothing here imports a framework: store errors are stood in for by exceptions with
the type names and ``code`` attributes that ``classify`` reads.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import signal

import pytest

import entrypoint.planning.registry  # noqa: F401  (registers the frameworks' signs of a lost peer)
from entrypoint import errors, failures
from entrypoint.errors import (
    ConfigError,
    HostUnresolvableError,
    NonFiniteLoss,
    OutputError,
    PeerError,
    StopRequested,
)
from entrypoint.outputs.storage import StorageError

OUT = "/out/job"


class DefaultCredentialsError(Exception):
    """Stands in for google.auth's: ``classify`` matches store causes by type name."""


class RefreshError(Exception):
    """Stands in for google.auth's expired or revoked credentials."""


class HttpError(Exception):
    """Stands in for gcsfs's HttpError: an HTTP status in ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        super().__init__(f"HTTP {code}")


class DistNetworkError(RuntimeError):
    """Stands in for torch.distributed's: a peer type PyTorch declares, matched by name and top package."""


DistNetworkError.__module__ = "torch.distributed"


class RendezvousTimeoutError(Exception):
    """Stands in for torch elastic's: a declared peer type, whatever its base."""


RendezvousTimeoutError.__module__ = "torch.distributed.elastic.rendezvous.api"


class DistBackendError(RuntimeError):
    """Stands in for torch.distributed's backend error (a declared peer type): what NCCL's failures arrive as."""


DistBackendError.__module__ = "torch.distributed"
# What torch 2.11 with NCCL 2.28.9 raised on an H200 for a stray NCCL_NET=gIB under --fabric off (bench/gpu_check.sh).
NCCL_REFUSED = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with "
                "NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid "
                "usage of NCCL library.\nLast error:\nFailed to initialize any NET plugin")


class UserDefined(DistNetworkError):
    """A user's exception deriving from a peer type: still a peer failure (the MRO is searched)."""


class UnavailableError(Exception):
    """A user's class named like TensorFlow's: not TensorFlow's (its package is the user's)."""


class ClosureInputError(Exception):
    """Stands in for TensorFlow's coordinator error wrapping another (a type defined where its collectives run)."""


ClosureInputError.__module__ = "tensorflow.python.distribute.coordinator.cluster_coordinator"


def raised_in(module: str, exc: BaseException) -> BaseException:
    """``exc`` as raised by code of ``module`` (a collective's, the store's, the user's): where it happened."""
    namespace: dict[str, object] = {"__name__": module}
    exec("def throw(error):\n    raise error\n", namespace)
    try:
        namespace["throw"](exc)  # type: ignore[operator]
    except BaseException as raised:
        return raised
    raise AssertionError("not raised")


C10D = "torch.distributed.distributed_c10d"


def storage(cause: BaseException, url: str = "gs://bkt/job/model/x.pt") -> StorageError:
    return StorageError(url, cause)


@pytest.mark.parametrize(("exc", "cls", "code"), [
    # the entrypoint's own errors carry their class
    (ConfigError("CLUSTER_SPEC", "not JSON"), "config", 2),
    (PeerError("worker 1 never came"), "peer_lost", 129),
    (HostUnresolvableError("w-1 did not resolve"), "host_unresolvable", 196),
    (NonFiniteLoss("nan"), "nonfinite_loss", 65),
    (OutputError(errors.DISK_FULL, "full"), "disk_full", 74),
    (OutputError(errors.OUTPUT_NOT_WRITABLE, "read-only"), "output_not_writable", 73),
    (StopRequested(signal.SIGTERM, "stopped by SIGTERM"), "preempted", 143),
    (StopRequested(signal.SIGINT, "stopped by SIGINT"), "signal", 130),
    # the OS's errnos that are mapped; the rest are the user's
    (OSError(errno.ENOSPC, "No space left on device", f"{OUT}/x"), "disk_full", 74),
    (OSError(errno.ENOSPC, "No space left on device"), "disk_full", 74),  # no file name: still the disk
    (OSError(errno.EDQUOT, "Disk quota exceeded", f"{OUT}/x"), "disk_full", 74),
    (OSError(errno.EROFS, "Read-only file system", "/anywhere"), "output_not_writable", 73),
    (PermissionError(errno.EACCES, "Permission denied", f"{OUT}/model"), "output_not_writable", 73),
    (PermissionError(errno.EPERM, "Operation not permitted", f"{OUT}/model"), "output_not_writable", 73),
    (PermissionError(errno.EACCES, "Permission denied", "/out"), "output_not_writable", 73),  # a parent to create
    (PermissionError(errno.EACCES, "Permission denied", "/data/train.csv"), "user_code", 1),  # not an output
    (PermissionError(errno.EACCES, "Permission denied"), "user_code", 1),  # no file name: cannot tell
    (FileNotFoundError(errno.ENOENT, "No such file or directory", f"{OUT}/x"), "user_code", 1),
    (IsADirectoryError(errno.EISDIR, "Is a directory", f"{OUT}/x"), "user_code", 1),
    # a peer gone or stuck: a framework's declared type (MRO included), or a runtime / connection error raised
    # where a collective or the store runs that names a connection or a timeout
    (DistNetworkError("anything"), "peer_lost", 129),
    (DistBackendError("NCCL communicator was aborted on rank 1"), "peer_lost", 129),
    # NCCL refusing this node's configuration is the job's to fix, not a peer to wait for (retried forever)
    (DistBackendError(NCCL_REFUSED), "config", 2),
    (raised_in(C10D, RuntimeError(NCCL_REFUSED)), "config", 2),
    (raised_in("trainer.task", RuntimeError("ncclInvalidUsage in my own wrapper")), "user_code", 1),
    (RendezvousTimeoutError("anything"), "peer_lost", 129),
    (UserDefined("anything"), "peer_lost", 129),
    (raised_in(C10D, ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")), "peer_lost", 129),
    (raised_in(C10D, ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")), "peer_lost", 129),
    (raised_in(C10D, TimeoutError("Timed out waiting for the store")), "peer_lost", 129),
    (raised_in("torch.nn.parallel.distributed", RuntimeError("NCCL communicator was aborted on rank 3")),
     "peer_lost", 129),
    (raised_in("torch.autograd.graph", RuntimeError("[gloo] Connection closed by peer [10.0.0.2]:4242")),
     "peer_lost", 129),  # DDP's all-reduce in the backward pass
    (raised_in("torch.autograd.graph", RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                                                    "Application timeout caused pair closure")),
     "peer_lost", 129),  # a frozen peer seen by gloo's own timeout before the heartbeats name it
    (raised_in("horovod.torch.mpi_ops", RuntimeError("Horovod has been shut down")), "peer_lost", 129),
    (raised_in("entrypoint.pytorch.recovery.vote", RuntimeError("Read error [10.0.0.2]:4242")), "peer_lost", 129),
    (raised_in(C10D, ValueError("connection closed by peer")), "user_code", 1),  # a ValueError is never a peer's
    (raised_in(C10D, RuntimeError("Tensors must be contiguous")), "user_code", 1),  # a misuse of a collective
    # the user's own code saying the same words is the user's error (not retried 24 times)
    (raised_in("trainer.task", RuntimeError("timed out waiting for the tracker")), "user_code", 1),
    (raised_in("trainer.task", ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")), "user_code", 1),
    (raised_in("requests.adapters", TimeoutError("timed out waiting")), "user_code", 1),
    (TimeoutError("Timed out waiting for the store"), "user_code", 1),  # nowhere known: not a peer's
    (raised_in("trainer.task", UnavailableError("a class named like TensorFlow's")), "user_code", 1),
    # the coordinator's wrapper, raised back in the user's callback: a refused connection is a lost peer (a ps or
    # worker restarting), the user's own dataset error is the user's
    (raised_in("trainer.task", ClosureInputError("Input has an error, the original exception is InternalError(), "
                                                 "error message is failed to connect to all addresses; last error: "
                                                 "UNKNOWN: ipv4:127.0.0.1:26294: Failed to connect to remote host: "
                                                 "Connection refused")), "peer_lost", 129),
    (raised_in("trainer.task", ClosureInputError("Input has an error, the original exception is ValueError('bad "
                                                 "row 7')")), "user_code", 1),
    # signals
    (KeyboardInterrupt(), "signal", 130),
    # the object store (StorageError's cause decides)
    (storage(DefaultCredentialsError("no ADC")), "output_not_writable", 73),
    (storage(RefreshError("token expired")), "output_not_writable", 73),
    (storage(HttpError(401)), "output_not_writable", 73),
    (storage(HttpError(403)), "output_not_writable", 73),
    (storage(HttpError(404)), "output_not_writable", 73),
    (storage(FileNotFoundError("no such bucket")), "output_not_writable", 73),
    (storage(HttpError(500)), "storage_unavailable", 197),
    (storage(HttpError(503)), "storage_unavailable", 197),
    (storage(HttpError(429)), "storage_unavailable", 197),
    (storage(ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")), "storage_unavailable", 197),
    (storage(TimeoutError("read timed out")), "storage_unavailable", 197),
    (storage(OSError(errno.ENOSPC, "No space left")), "storage_unavailable", 197),  # the cause, not the errno
    # everything else is the user's code
    (MemoryError(), "user_code", 1),
    (ImportError("cannot import name 'train' from 'trainer'"), "user_code", 1),
    (ModuleNotFoundError("No module named 'trainer'", name="trainer"), "user_code", 1),
    (RuntimeError("CUDA error: device-side assert triggered"), "user_code", 1),
    (RuntimeError(), "user_code", 1),
    (AssertionError(), "user_code", 1),
])
def test_classify_row(exc: BaseException, cls: str, code: int) -> None:
    failure = failures.classify(exc, [OUT])
    assert (failure.cls.name, failure.exit_code) == (cls, code)
    assert failure.cls.exit_code == code and "\n" not in failure.message


@pytest.mark.parametrize(("value", "code"), [
    (None, 0), (0, 0), (1, 1), (2, 2), (143, 143), (137, 137), ("a message", 1), ("", 1), (True, 1), (False, 0),
])
def test_a_scripts_sys_exit_keeps_its_code(value: object, code: int) -> None:
    """Outside the hooks loop ``sys.exit(x)`` ends the run with the status the shell would show."""
    failure = failures.classify(SystemExit(value))
    assert (failure.cls.name, failure.exit_code) == ("user_code", code)
    assert errors.sys_exit_code(SystemExit(value)) == code


@pytest.mark.parametrize("value", [None, 0, 1, 143, "done"])
def test_any_sys_exit_inside_the_hooks_loop_is_a_user_code_failure(value: object) -> None:
    """The hooks loop must finish: even ``sys.exit(0)`` from a hook ends the run as a failure (exit 1)."""
    failure = failures.classify(SystemExit(value), hooks=True)
    assert (failure.cls.name, failure.exit_code) == ("user_code", 1)


@pytest.mark.parametrize(("value", "shell"), [(256, 0), (257, 1), (-1, 255), (399, 143)])
def test_sys_exit_codes_outside_0_255_are_reported_as_the_shell_sees_them(value: int, shell: int) -> None:
    assert errors.sys_exit_code(SystemExit(value)) == shell


def test_a_classified_message_is_one_line_whole_and_bounded() -> None:
    """The record keeps a long message whole (the last line clips it: tests/unit/test_last_line.py), bar a
    pathological one."""
    failure = failures.classify(RuntimeError("first\nsecond\t" + "x" * 2000))
    assert failure.message == "RuntimeError: first second " + "x" * 2000
    failure = failures.classify(RuntimeError("x" * 100_000))
    assert len(failure.message) <= 8000 + len("RuntimeError: ") and failure.message.endswith("...")


def test_store_messages_name_the_bucket_and_never_the_whole_cause() -> None:
    down = failures.classify(storage(ConnectionRefusedError("x" * 1000), "gs://bkt/job/ckpt/state.pt"))
    assert down.message.startswith("gs://bkt unreachable or failing writing gs://bkt/job/ckpt/state.pt")
    assert "retry the job" in down.message and "x" * 201 not in down.message
    missing = failures.classify(storage(HttpError(404), "gs://nobucket/job"))
    assert missing.message == "gs://nobucket: no such bucket (create it, or fix the URL): gs://nobucket/job"


@pytest.mark.parametrize(("status", "cls"), [
    (0, "user_code"),  # code_class is only asked about failures; 0 has no row of its own
    (1, "user_code"), (2, "config"), (3, "user_code"), (73, "output_not_writable"), (74, "disk_full"),
    (127, "user_code"), (129, "peer_lost"), (130, "signal"), (137, "signal"), (142, "peer_lost"),
    (143, "preempted"), (196, "host_unresolvable"), (197, "storage_unavailable"), (255, "user_code"),
])
def test_a_bare_exit_status_gets_the_class_of_its_row(status: int, cls: str) -> None:
    """A child that left no record (killed, or a script's own status): ``code_class`` reads the status."""
    found = failures.code_class(status)
    assert (found.name, found.exit_code) == (cls, status)
    assert failures.exit_failure(status).exit_code == status


def test_a_bare_exit_65_is_a_nonfinite_loss() -> None:
    assert failures.code_class(65) == errors.NONFINITE_LOSS


@pytest.mark.parametrize(("signum", "code", "cls"), [
    (signal.SIGTERM, 143, "preempted"), (signal.SIGINT, 130, "signal"), (signal.SIGKILL, 137, "signal"),
    (signal.SIGHUP, 129, "signal"), (signal.SIGALRM, 142, "signal"), (signal.SIGABRT, 134, "signal"),
    (signal.SIGSEGV, 139, "signal"), (64, 192, "signal"),
])
def test_signal_classes_are_128_plus_the_number(signum: int, code: int, cls: str) -> None:
    found = errors.signal_class(signum)
    assert (found.name, found.exit_code) == (cls, code) and errors.is_retryable(code)


@pytest.mark.parametrize(("code", "retryable"), [(0, False), (1, False), (65, False), (73, False), (74, False),
                                                  (124, False), (127, False),
                                                  (128, True), (129, True), (143, True), (197, True)])
def test_retryable_means_128_and_above(code: int, retryable: bool) -> None:
    assert errors.is_retryable(code) is retryable



def test_hang_and_the_start_deadline_are_consequences_with_their_own_codes() -> None:
    """Neither is an exception: the watchdogs record them directly; they share the peer_lost handling."""
    assert sorted(errors.CONSEQUENCES) == ["hang", "peer_lost"]
    assert (errors.HANG.name, errors.HANG.exit_code) == ("hang", 129)
    assert (errors.START_DEADLINE.name, errors.START_DEADLINE.exit_code) == ("peer_lost", 142)


def test_the_start_deadline_watcher_gets_the_whole_failure_context_as_json() -> None:
    """Every field crosses to the watcher process as JSON (a frozenset once made every TensorFlow start fail)."""
    from entrypoint.lifecycle.watch.watchdog import context_json, context_of

    ctx = failures.FailureContext(replica="workerpool1-0", rank=1, job_dir="/tmp/job",
                                  before=frozenset({"a.json", "b.json"}), secrets=frozenset({"hidden"}), step=3)
    back = context_of(json.loads(json.dumps(context_json(ctx))))
    assert back == dataclasses.replace(ctx, secrets=frozenset(), outputs=())


def test_nccl_refusing_its_configuration_says_why_and_names_the_variables_set_never_their_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_NET", "gIB")
    monkeypatch.setenv("NCCL_FASTRAK_TEST_TOKEN", "s3cr3t-value")
    failure = failures.classify(DistBackendError(NCCL_REFUSED), [OUT])
    assert (failure.cls.name, failure.exit_code) == ("config", 2)
    assert "ncclInvalidUsage: Failed to initialize any NET plugin" in failure.message
    assert "NCCL_FASTRAK_TEST_TOKEN, NCCL_NET" in failure.message and "--fabric auto" in failure.message
    assert "s3cr3t" not in failure.message and "\n" not in failure.message
