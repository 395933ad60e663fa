"""Reference answers (and wrong answers the checks must reject) for lesson 14. See lessons/README.md."""
# ruff: noqa: F811


# %% [solution block]
def block_activation_bytes(s, b, h, a, itemsize):
    sbh = s * b * h
    layer_norms = 2 * (2 * sbh + s * b + h)  # input, x-hat, 1/std, weight/h; twice
    # c_attn's input, q k v, q * scale, the probabilities, the output, the heads' join, c_proj's output
    attention = sbh + 3 * sbh + sbh + a * s * s * b + sbh + sbh + sbh
    mlp = sbh + 4 * sbh + 4 * sbh + 4 * sbh + sbh  # c_fc in, GELU in and tanh, c_proj in, c_proj out
    return itemsize * (layer_norms + attention + mlp)


# %% [wrong block]
def block_activation_bytes(s, b, h, a, itemsize):
    return 2 * s * b * h * (34 + 5 * a * s / h)  # the paper's 16-bit count, not this engine's


# %% [wrong block]
def block_activation_bytes(s, b, h, a, itemsize):
    sbh = s * b * h
    layer_norms = 2 * (2 * sbh + s * b + h)
    attention = sbh + 3 * sbh + sbh + a * s * s * b + sbh + sbh + sbh
    mlp = sbh + 4 * sbh + 4 * sbh + 4 * sbh + sbh
    return layer_norms + attention + mlp  # values, not bytes
