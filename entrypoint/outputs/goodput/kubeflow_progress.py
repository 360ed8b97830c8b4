"""Training progress posted to Kubeflow Trainer, so that the TrainJob's ``status.trainerStatus`` shows it.

Kubeflow Trainer (v2.2 and later, its ``TrainJobStatus`` feature gate) runs a status server beside its controller
and gives every trainer container three variables (``settings.read_settings`` reads them):
``KUBEFLOW_TRAINER_SERVER_URL``, the HTTPS endpoint of this TrainJob
(``/apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status``);
``KUBEFLOW_TRAINER_SERVER_CA_CERT``, the path of the CA certificate its TLS certificate is verified by; and
``KUBEFLOW_TRAINER_SERVER_TOKEN``, the path of a projected service account token (a JWT whose audience names the
TrainJob, rotated by the kubelet: read again for every post). Each update is one ``POST`` of JSON with
``Authorization: Bearer <token>``, shaped as Kubeflow's SDK (``update_trainjob_status``) sends it::

    {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 120,
                       "metrics": [{"name": "loss", "value": "0.15"}], "lastUpdatedTime": "2026-11-27T21:00:00Z"}}

The server takes whole percentages from 0 to 100, seconds >= 0 (both 32-bit), at most 256 metrics whose name and
value are strings of 1 to 64 characters, and requires ``lastUpdatedTime``; anything else rejects the whole update.

Only the chief posts (the variables are in every replica). ``update`` never waits: it leaves the newest update for
one daemon thread, which posts it (with ``TIMEOUT``) and at most once every ``MIN_INTERVAL`` seconds (Kubeflow asks
clients to keep to that), so updates that come faster are coalesced and only the newest is sent. A failing post is
one warning, then at most one every ``WARN_EVERY`` seconds; it never raises into, slows or stops training. ``close``
posts what is still pending, waiting at most the time it is given. The token's value is never logged.
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlsplit

from entrypoint.cluster import envvars as ev
from entrypoint.cluster.environments.settings import PlatformSettings, read_settings
from entrypoint.outputs import redaction
from entrypoint.periodic import Periodic

log = logging.getLogger("entrypoint")

TIMEOUT = 10.0  # seconds for one post (connect, send, answer)
MIN_INTERVAL = 5.0  # seconds between posts, as Kubeflow's SDK throttles them
WARN_EVERY = 600.0  # seconds between warnings while posts keep failing
MAX_METRICS = 256  # the server's limit (more rejects the whole update)
MAX_TEXT = 64  # characters of a metric's name and of its value, likewise
INT32_MAX = 2**31 - 1
_MAX_ANSWER = 1 << 16  # bytes of an answer read (the server's own body limit)
_MAX_REASON = 200  # characters of the server's message kept in a warning


@dataclass(frozen=True)
class _Update:
    step: int
    total_steps: int | None
    metrics: dict[str, float]
    done: bool
    wall: float  # time.time() of the update: its lastUpdatedTime
    clock: float  # time.monotonic() of the update: the rate the ETA comes from


class KubeflowProgress:
    """Posts the training's progress to one TrainJob's status endpoint from a daemon thread (see the module)."""

    def __init__(self, url: str, ca_file: str | None, token_file: str, *, timeout: float = TIMEOUT,
                 min_interval: float = MIN_INTERVAL) -> None:
        """``url``: the endpoint; ``ca_file``: the PEM file the server's certificate must chain to (None: the
        system's CAs); ``token_file``: the file holding the bearer token, read again for each post."""
        self.url = url
        self.ca_file = ca_file
        self.token_file = token_file
        self.timeout = timeout
        self.min_interval = min_interval
        self._cond = threading.Condition()
        self._pending: _Update | None = None
        self._posting = False
        self._closing = False
        self._last_post: float | None = None  # monotonic start of the last post
        self._first: _Update | None = None  # the first update posted: the ETA's rate is measured from it
        self._last: _Update | None = None  # the last one (a step lower than its step starts the rate afresh)
        self._failures = 0  # failed posts since the last warning
        self._failing = False  # the last post failed
        self._warned_at: float | None = None
        self.posted = 0  # posts the server answered with success
        self.failed = 0  # posts that failed
        self._poster = Periodic("kubeflow-progress", self._post_due, self._next_post).start()

    @classmethod
    def from_settings(cls, settings: PlatformSettings | None = None) -> KubeflowProgress | None:
        """One for this TrainJob where Kubeflow Trainer set its progress variables (``settings``: read now when
        None); None where it did not, or where they cannot be used (one warning says why; training goes on)."""
        found = read_settings() if settings is None else settings
        url = found.kubeflow_server_url
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            log.warning("Kubeflow Trainer progress: %s is not an http(s) URL; the job's progress is not posted",
                        ev.KUBEFLOW_TRAINER_SERVER_URL)
            return None
        if found.kubeflow_server_token_file is None:
            log.warning("Kubeflow Trainer progress: %s is set but %s is not (the server needs its token); the "
                        "job's progress is not posted", ev.KUBEFLOW_TRAINER_SERVER_URL,
                        ev.KUBEFLOW_TRAINER_SERVER_TOKEN)
            return None
        return cls(url, found.kubeflow_server_ca_cert, found.kubeflow_server_token_file)

    def update(self, step: int, total_steps: int | None, metrics: Mapping[str, float], done: bool = False) -> None:
        """The training is at ``step`` of ``total_steps`` (None: unknown) with ``metrics``; ``done``: it finished
        (100%, nothing remaining). Returns at once: the thread posts the newest update it has not sent."""
        item = _Update(step, total_steps, dict(metrics), done, time.time(), time.monotonic())
        with self._cond:
            if self._closing:
                return
            self._pending = item
            self._cond.notify_all()
        self._poster.wake()

    def close(self, timeout: float) -> bool:
        """Post what is pending now (no interval to wait for), waiting at most ``timeout`` seconds; no update is taken
        after it. True when everything given was posted or given up on, False when a post was still under way."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._poster.wake()
            while self._pending is not None or self._posting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # --- the thread ---------------------------------------------------------------------------------------------

    def _next_post(self) -> float | None:
        """Seconds until the pending update is due (None: none pending, wait for one)."""
        with self._cond:
            if self._closing or (self._pending is not None and self._pending.done):
                return 0.0
            return None if self._pending is None else max(self._wait_left(), 0.0)

    def _post_due(self) -> bool:
        """Post the pending update if it is due (an update wakes the thread early); False once closed and done."""
        with self._cond:
            if self._pending is None:
                return not self._closing
            if self._wait_left() > 0 and not self._closing and not self._pending.done:
                return True  # woken by a newer update: it goes at the interval's end
            item, self._pending = self._pending, None
            self._posting = True
            self._last_post = time.monotonic()
        try:
            self._post(item)
        finally:
            with self._cond:
                self._posting = False
                self._cond.notify_all()
        return True

    def _wait_left(self) -> float:
        return 0.0 if self._last_post is None else self._last_post + self.min_interval - time.monotonic()

    def _post(self, item: _Update) -> None:
        token = ""
        try:
            token = _token(self.token_file)
            context = _context(self.ca_file)
            body = json.dumps({"trainerStatus": self._status(item)}).encode()
            request = urllib.request.Request(self.url, data=body, method="POST", headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as answer:
                answer.read(_MAX_ANSWER)
        except urllib.error.HTTPError as e:
            self._failed(f"HTTP {e.code}{_message(e)}", token)
        except _Failure as e:
            self._failed(str(e), token)
        except OSError as e:  # unreachable, refused, timed out, TLS (ssl.SSLError, certificate not verified)
            reason = getattr(e, "reason", None)  # urllib's URLError: what underneath failed
            self._failed(str(reason) if reason else f"{type(e).__name__}: {e.strerror or e}", token)
        except Exception as e:  # never into training: whatever else went wrong is one more failed post
            self._failed(f"{type(e).__name__}: {e}", token)
        else:
            self._succeeded()

    def _status(self, item: _Update) -> dict[str, object]:
        """The ``trainerStatus`` object for ``item`` (the server's limits kept; see the module)."""
        status: dict[str, object] = {
            "lastUpdatedTime": datetime.fromtimestamp(item.wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        total = item.total_steps
        if item.done:
            status["progressPercentage"] = 100
            status["estimatedRemainingSeconds"] = 0
        elif total is not None and total > 0:
            status["progressPercentage"] = max(0, min(100, (100 * item.step) // total))
            if (eta := self._eta(item, total)) is not None:
                status["estimatedRemainingSeconds"] = eta
        metrics: dict[str, float] = {"step": item.step}
        if total is not None:
            metrics["total_steps"] = total
        metrics.update(item.metrics)  # the caller's own win
        kept = [{"name": str(name), "value": _value(value)} for name, value in metrics.items()
                if 0 < len(str(name)) <= MAX_TEXT]
        status["metrics"] = kept[:MAX_METRICS]
        return status

    def _eta(self, item: _Update, total: int) -> int | None:
        """Seconds left at the rate since the first update posted (measured afresh once the step went back)."""
        first, last = self._first, self._last
        self._last = item
        if first is None or last is None or item.step < last.step:
            self._first = first = item
        steps, seconds = item.step - first.step, item.clock - first.clock
        if steps <= 0 or seconds <= 0:
            return None
        left = max(0, total - item.step) * seconds / steps
        return min(INT32_MAX, math.ceil(left))

    def _failed(self, reason: str, token: str) -> None:
        self.failed += 1
        self._failing = True
        self._failures += 1
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY:
            return
        reason = redaction.hide(reason, {token} if token else ())
        again = "" if self._warned_at is None else f" ({self._failures} failed posts since the last warning)"
        log.warning("Kubeflow Trainer progress: posting the job's progress to %s failed: %s%s; training goes on "
                    "(this is said again at most every %d min while posts fail)", self.url, reason, again,
                    WARN_EVERY // 60)
        self._warned_at, self._failures = now, 0

    def _succeeded(self) -> None:
        self.posted += 1
        if self._failing:
            log.info("Kubeflow Trainer progress: posting to %s works again", self.url)
        self._failing = False


class _Failure(Exception):
    """A post that cannot be made (said in the warning as it is)."""


def _token(path: str) -> str:
    """The bearer token in ``path`` (the kubelet rotates it: read for each post)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise _Failure(f"the token file ({ev.KUBEFLOW_TRAINER_SERVER_TOKEN}) cannot be read: "
                       f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
    if not token:
        raise _Failure(f"the token file ({ev.KUBEFLOW_TRAINER_SERVER_TOKEN}) is empty")
    return token


def _context(ca_file: str | None) -> ssl.SSLContext:
    """TLS that trusts only ``ca_file`` (None: the system's CAs), host names checked (loaded for each post: the
    platform rotates its certificates)."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ValueError) as e:  # missing, unreadable, or no certificate in it (ssl.SSLError is an OSError)
        raise _Failure(f"the CA certificate ({ev.KUBEFLOW_TRAINER_SERVER_CA_CERT}) cannot be used: "
                       f"{getattr(e, 'strerror', None) or getattr(e, 'reason', None) or e}") from None


def _value(value: float) -> str:
    """A metric's value as the server takes it: a string of at most 64 characters."""
    text = str(value)
    return text if len(text) <= MAX_TEXT else f"{float(value):.17g}"


def _message(error: urllib.error.HTTPError) -> str:
    """``: <message>`` from the server's Kubernetes-style Status answer, if it has one."""
    try:
        answer = json.loads(error.read(_MAX_ANSWER) or b"{}")
    except (ValueError, OSError):
        return ""
    message = answer.get("message") if isinstance(answer, dict) else None
    return f": {str(message)[:_MAX_REASON]}" if message else ""
