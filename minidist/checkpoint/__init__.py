"""Checkpointing that never loses work.

Reading order: ``errors.py`` -> ``atomic.py`` (durable writes, the commit protocol, ``latest``) ->
``manifest.py`` (what a checkpoint contains) -> ``layout.py`` (global names, who writes which shard) ->
``optim_state.py`` (optimizer state by name, ZeRO included) -> ``schema.py`` (checking a manifest) ->
``save.py`` -> ``reshard.py`` -> ``load.py`` -> ``latest.py`` (resume, stepping back past damage) ->
``cli.py`` (``python -m minidist checkpoint info``).

On disk::

    DIR/latest                      text file: the name of the newest complete checkpoint
    DIR/step_000000123/manifest.json
    DIR/step_000000123/rank00000.safetensors ...   one file per rank that wrote something

``save``/``load``/``load_latest`` are collective (every rank calls them); importing this package
does not initialise MPI (that happens on the first collective call).
"""

from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.latest import load_latest
from minidist.checkpoint.load import load
from minidist.checkpoint.save import save

__all__ = ["CheckpointError", "load", "load_latest", "save"]
