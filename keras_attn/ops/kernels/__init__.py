"""Attention kernels: pure functions of projected, scaled queries, keys and values.

Each takes an `AttentionMask` (or the boolean block it gives) and never the layer's arguments;
`keras_attn.ops.attend` chooses one. `dense` forms the `(T, S)` weights (with a
fused backward when the weights are not returned), `blockwise` visits keys in blocks with an
online softmax, `local` attends within a sliding window in O(T · window), `linear` is
kernelized attention (not softmax) in O(T), and `fused` hands the call to the backend's own
attention op (torch SDPA, `jax.nn.dot_product_attention`, Keras' op).
"""
