"""Reference answers (and wrong answers the checks must reject) for lesson 08. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution files]
def files_before_latest(step, writers):
    folder = f"step_{step:09d}"
    return {f"{folder}/manifest.json"} | {f"{folder}/rank{r:05d}.safetensors" for r in writers}


# %% [wrong files]
def files_before_latest(step, writers):
    return {f"step_{step:09d}/rank{r:05d}.safetensors" for r in writers}  # forgets the manifest


# %% [wrong files]
def files_before_latest(step, writers):
    folder = f".tmp-step_{step:09d}"  # the folder is renamed BEFORE latest is switched
    return {f"{folder}/manifest.json"} | {f"{folder}/rank{r:05d}.safetensors" for r in writers}


# %% [solution shards]
def shards_needed(size, saved_tp, new_tp, r):
    saved, new = size // saved_tp, size // new_tp
    lo, hi = r * new, (r + 1) * new  # global rows this rank needs
    pieces = []
    for k in range(lo // saved, (hi - 1) // saved + 1):  # the saved shards that overlap [lo, hi)
        pieces.append((k, max(lo, k * saved) - k * saved, min(hi, (k + 1) * saved) - k * saved))
    return pieces


# %% [wrong shards]
def shards_needed(size, saved_tp, new_tp, r):
    return [(k, 0, size // saved_tp) for k in range(saved_tp)]  # reads every shard whole


# %% [wrong shards]
def shards_needed(size, saved_tp, new_tp, r):
    saved, new = size // saved_tp, size // new_tp
    lo, hi = r * new, (r + 1) * new
    overlapping = range(lo // saved, (hi - 1) // saved + 1)
    return [(k, max(lo, k * saved), min(hi, (k + 1) * saved)) for k in overlapping]  # global rows, not local
