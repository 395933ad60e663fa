"""Checkpointing that never loses work.

Reading order, the mechanism first (``save`` and ``load`` each begin with their numbered steps, one
call per step; a step that is a check is one call into the check modules, read last):

1. ``atomic.py``: durable writes (a rank's shard file, hashed while it is fsynced), the commit
   protocol (rename into place, then ``latest``), pruning;
2. ``format.py``: what a checkpoint is on disk, ``manifest.json`` and the safetensors shard files;
3. ``layout.py``: global names, who writes each shard, and resharding (who reads which shards;
   pieces are cut and put back by ``parallel/tensor_parallel/split.py``'s rule: uneven, strided);
4. ``optim_state.py``: optimizer state by global name, ZeRO included; ``fsdp_state.py``: FSDP's
   shards gathered to full tensors and cut back; ``collect.py``: what a rank saves (tied copies are
   not saved);
5. ``stage.py`` (what a save copies when it is called) -> ``save.py`` -> ``background.py`` (the
   asynchronous save: ``SaveHandle``, ``wait_pending``) -> ``load.py`` -> ``latest.py`` (resume,
   stepping back past damage);
6. the safety net: ``checks.py`` (how every rank comes to raise the same ``CheckpointError``; the
   arguments, an existing step, whether a checkpoint fits the model, optimizer and sampler),
   ``file_checks.py`` (every manifest field; each shard file's size, sha256 and tensors) and
   ``errors.py`` (the exception classes).

``minidist checkpoint info DIR`` (``minidist_tools/checkpoint_info.py``) lists and verifies
checkpoints without MPI.

On disk::

    DIR/latest                      text file: the name of the newest complete checkpoint
    DIR/step_000000123/manifest.json
    DIR/step_000000123/rank00000.safetensors ...   one file per rank that wrote something

``save``/``load``/``load_latest`` are collective (every rank calls them); importing this package
does not initialise MPI (that happens on the first collective call). ``save(..., async_save=True)``
returns once the state is copied to host memory and writes on a background thread.
"""

from minidist.checkpoint.background import SaveHandle, wait_pending
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.latest import load_latest
from minidist.checkpoint.load import load
from minidist.checkpoint.save import save

__all__ = ["CheckpointError", "SaveHandle", "load", "load_latest", "save", "wait_pending"]
