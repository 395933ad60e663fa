"""Performance models: pure arithmetic over published formulas, checked against measurements.

``step.py`` (one data/tensor/pipeline-parallel training step: compute, bubble, communication) ->
``network.py`` (a two-level network: links inside and between nodes; gradient compression from
``compression.py``) -> ``transformer.py`` (a GPT layer's FLOPs, bytes per group, activation memory) ->
``memory.py`` (a GPT's memory per rank) -> ``failures.py`` (failure rates, checkpoint intervals,
expected lost work).
"""
