"""Image references read apart, once: ``REGISTRY/PATH/NAME[:TAG][@DIGEST]`` -> the name, tag and digest.

Our images are named after their framework (``Framework.image``): ``.../pytorch:v1``, ``.../pytorch-cpu:v1``
(the CPU variant), ``.../horovod:v1-rs`` (built with the Reduction Server NCCL plugin, docs/images.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from entrypoint.planning import registry

LOCAL_PREFIX = "trainer-"  # images/local_build.py names its builds localhost/trainer-<image>:<variant>


@dataclass(frozen=True)
class ImageRef:
    """``us-docker.pkg.dev/p/r/pytorch-cpu:v1@sha256:...``: name ``pytorch-cpu``, tag ``v1``, the digest."""

    uri: str
    name: str
    tag: str = ""
    digest: str = ""

    @property
    def cpu(self) -> bool:
        """A CPU variant (``<image>-cpu``): no CUDA inside."""
        return self.name.endswith("-cpu")

    def framework(self) -> str | None:
        """The registered framework whose image this is, by name (``pytorch-cpu`` -> pytorch; a local build's
        ``trainer-pytorch``, images/local_build.py, too)."""
        found = registry.by_image(self.name) or registry.by_image(self.name.removeprefix(LOCAL_PREFIX))
        return found.name if found is not None else None


def parse_image(uri: str) -> ImageRef:
    """Split an image URI; a registry host's port (``localhost:5000/x``) is not a tag."""
    last = uri.rsplit("/", 1)[-1]
    named, _, digest = last.partition("@")
    name, _, tag = named.partition(":")
    return ImageRef(uri, name, tag, digest)
