"""gcp-storage-emulator with the object preconditions Cloud Storage checks, for the gs:// tests (``tests/gcs.py``).

The emulator ignores ``ifGenerationMatch``; Cloud Storage answers an upload or a delete whose precondition fails
with 412 Precondition Failed (``0``: the object must not exist), which is how two writers of one object (the
job dir's lease) know which one won. This script adds that check to the emulator's upload and delete handlers,
one request at a time, and then runs the emulator as ``python -m gcp_storage_emulator`` would (same arguments).
"""

from __future__ import annotations

import runpy
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

Handler = Callable[..., Any]
_ONE_AT_A_TIME = threading.Lock()  # the check and the write, as one step


def _object_name(request: Any) -> str | None:
    if request.params.get("object_id"):
        return str(request.params["object_id"])
    if request.query.get("name"):
        return str(request.query["name"][0])
    data = request.data
    if not isinstance(data, dict):
        return None
    meta: dict[str, Any] = data["meta"] if isinstance(data.get("meta"), dict) else data
    name = meta.get("name")
    return None if name is None else str(name)


def checked(handler: Handler) -> Handler:
    """``handler``, answering 412 when the request's ``ifGenerationMatch`` is not the object's generation."""

    def check(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if not wanted:
            return handler(request, response, storage, *args, **kwargs)
        with _ONE_AT_A_TIME:
            try:
                current = str(storage.get_file_obj(request.params["bucket_name"], _object_name(request))["generation"])
            except NotFound:
                current = "0"
            if current != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                why = "At least one of the pre-conditions you specified did not hold."
                response.json({"error": {"code": 412, "message": why, "errors": [{"reason": "conditionNotMet"}]}})
                return None
            return handler(request, response, storage, *args, **kwargs)

    return check


def install() -> None:
    """Check preconditions in every route that uploads or deletes an object."""
    originals = {objects.insert, objects.delete}
    for _pattern, methods in server.HANDLERS:
        for method, handler in list(methods.items()):
            if handler in originals:
                methods[method] = checked(handler)
    objects.insert = checked(objects.insert)  # the server's fallback for uploads posted without /upload


if __name__ == "__main__":
    install()
    runpy.run_module("gcp_storage_emulator", run_name="__main__", alter_sys=True)
