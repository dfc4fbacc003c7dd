"""Random neural operators (a family of systems): stochastic CNNs sampled from a parameter space and iterated on 2D fields.

One operator O (parameters in `OperatorSpace`, weights from its own seed) maps a state x of C channels
on the periodic n x n grid to C channels:

    h = act(conv_k(x))                                   stem, C -> w_0
    h = act(norm(conv_k(h)))  (+ h for a residual block when the width is unchanged),  l = 1..depth,
                                                          widths w_l = min(stem_width 2^l, width_cap)
    O(x) = conv_1(h) + noise_scale * xi                  1x1 head back to C; xi ~ N(0, 1) per value and step

Convolutions pad periodically. `norm` is instance norm or group norm over groups of 8 channels, without
affine parameters. Weights are N(0, gain^2 / fan_in), biases N(0, 0.1^2), drawn in float32 from
torch.Generator(operator seed) in layer order (weight then bias). The update policy is one of
x <- O(x) (autoregressive), x <- x + dt O(x) (residual), x <- a x + (1 - a) O(x) (convex), all written
x <- p x + q O(x). Each operator runs M realizations: the same initial field, independent noise streams,
one torch.Generator per (operator, realization) seeded from that row's seed, drawing one (C, n, n)
block per step. The noise and the state are float32 whatever the convolution precision.

Three ways to run the same operators:
- `RandomCNN` + `reference_rollout`: the straightforward way, one operator at a time in eager float32
  (realizations batched). It is the definition.
- `FusedOperators` (random_cnn_fused.py, `engine: fused`, the default): one operator at a time with its
  realizations, bf16 channels-last convolutions, normalisation + activation + residual + padding fused
  by torch.compile; the fastest on CPU.
- `GroupedOperators` (`engine: grouped`): K operators of one architecture as one grouped convolution
  over (M, K C, n, n), eager; the fewest kernel launches (the GPU layout).
`grouped_rollout` runs either kind of group (state (K, M, C, n, n), preallocated trajectory and noise
buffers, subnormals flushed to zero during the rollout); `generate_operators` groups a batch by
architecture and splits groups to fit a memory budget, halving the split and retrying on out-of-memory.
"""
