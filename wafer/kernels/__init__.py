"""The kernel library. Importing this package registers every kernel in KERNELS.

Catalog (the contract between the compiler, which emits these, and the simulator, which
runs them). Shapes are per sample; `activation` attrs take the names of the `activation`
kernel's functions. Inputs and outputs are float32 unless the dtype column says otherwise.

| type | inputs | attrs | params (role: shape) | dtypes |
|---|---|---|---|---|
| dense | x (..., n) | units, use_bias, activation | kernel: (n, units), bias: (units,) | |
| conv2d | x ([k,] H, W, C) NHWC [, the sample's own filter (kh, kw, C, filters): then no params, bias or activation (the weight program's convolution by a value of weights)] | filters, kernel_size [kh, kw], strides [sh, sw], padding SAME/VALID or [top, bottom, left, right], dilations [dh, dw] (default 1), use_bias, activation | kernel: (kh, kw, C, filters), bias: (filters,) | |
| conv2d_transpose | x (H, W, C) | filters, kernel_size, strides, padding SAME/VALID, dilations, output_size [OH, OW] (a conv2d of it gives back (H, W)) | kernel: (kh, kw, filters, C) | |
| depthwise_conv2d | x (H, W, C) | depth_multiplier M, kernel_size, strides, padding (as conv2d), dilations | kernel: (kh, kw, C, M); output channel c * M + q | |
| conv3d | x (D, H, W, C) NDHWC | filters, kernel_size [kd, kh, kw], strides [sd, sh, sw], padding SAME/VALID | kernel: (kd, kh, kw, C, filters) | |
| max_pool3d, avg_pool3d | x (D, H, W, C) | pool_size, strides (three each), padding; max: ties `first` (the gradient to a window's first maximum, as oneDNN's MaxPool3DGrad) or `near` (to every value within 1e-5 of it, as Eigen's), the host TF's rule | — | |
| tile | x | multiples [per-sample axis] | — | |
| resize | x (H, W, C) | size [OH, OW], method bilinear/nearest, align_corners, half_pixel_centers | — | |
| max_pool, avg_pool | x (H, W, C) | pool_size [ph, pw], strides [sh, sw], padding | — | |
| activation | x | function: relu, relu6, leaky_relu, elu, selu, tanh, sigmoid, softplus, linear, identity, neg, abs, square, sqrt, rsqrt, exp, expm1, log, log1p, reciprocal, erf, erfc, sin, cos, sign, softsign, pow; alpha (leaky_relu); exponent (pow, float) | — | |
| binary | the `i` operands | op: add, sub, mul, div, maximum, minimum, squared_difference, pow, greater, greater_equal, less, less_equal, equal, not_equal, logical_and, logical_or; operands (2 letters) | p<k>: attr p<k> | two operands of one dtype; add, sub, mul, maximum, minimum and comparisons also int32/int64, logical bool; comparisons and logical output bool |
| select | the `i` operands | operands (3 letters: cond, x, y) | p<k>: attr p<k> | cond bool (a weight's: its 0/1 float32, held where not 0); x, y one dtype: the output's |
| cast | x | dtype: float32, int32, int64, bool | — | x float32, int32, int64 or bool; output attr dtype |
| stop_gradient | x | — | — | any, passed through |
| one_hot | indices (...) | depth, on_value, off_value (axis -1) | — | indices int32/int64; output (..., depth) |
| slogdet | x (..., n, n) | output: sign, log_abs_det, determinant (tf.linalg.slogdet, det, in float64 rounded to float32) | — | float32; output (...); the gradient of log_abs_det: g times the inverse transpose, of determinant g det times it |
| cholesky | x (..., n, n) | — | — | float32 (tf.linalg.cholesky of the lower triangle, in float64 rounded to float32); output L (..., n, n); TF's _CholeskyGrad |
| solve | the `i` operands: a (..., n, n), b (..., n, k) | operands: ii, ic, ci, ip, pi; adjoint; triangle: "", lower, upper (tf.linalg.solve, inv, triangular_solve; float64 rounded to float32) | p<k>: attr p<k> | float32; output (..., n, k); TF's _MatrixSolveGrad, _MatrixTriangularSolveGrad |
| cumprod | x | axis (per-sample), exclusive, reverse | — | TF's Cumprod and _CumprodGrad (float16: TF's float16 scan) |
| reduce | x | op: sum, mean, max, min; axes [per-sample axes]; keepdims | — | float32; sum, max, min also int32/int64 |
| arg_reduce | x | op: max, min (tf.argmax, tf.argmin: the first index of the extreme, NaN never chosen, as TF's CPU kernel); axis (per-sample); output: int32, int64; half (the input holds float16 values) | — | x float32, int32, int64 or bool; output attr output, no gradient |
| softmax | x | axis (per-sample, -1 = last), log (bool: log_softmax) | — | |
| matmul | the `i` operands | operands: ii, ip, pi, ic, ci; transpose_a, transpose_b (BatchMatMulV2; activations per-sample rank >= 2, or rank 1 as the rows of operand 0 against a rank-2 weight/constant) | p<k>: attr p<k> | |
| transpose | x | perm [per-sample permutation] | — | any, passed through |
| slice | x | begin, end, strides (per-sample, resolved; stride < 0: end -1 = through element 0), shrink [axes] | — | any, passed through |
| take | x | axis (per-sample), indices [ints in [0, size)] (tf.gather at constant indices: tf.signal.frame, tf.roll; a weight's view) | — | any, passed through |
| spectrum | x (..., n) | fft_length N, part: magnitude, real, imag (of TF's RFFT: tf.abs(tf.signal.stft(...)), tf.math.real, tf.math.imag) | — | float32; output (..., N // 2 + 1) |
| pad | x | paddings [b0, a0, b1, a1, ...] per-sample, value | — | float32, int32, int64 |
| gather | indices (...) | operands "pi" (embedding lookup) | p0: (V, D...) | indices int32/int64 in [0, V); output indices + (D...) |
| embedding_bag | ids (k,), k <= 9 | operands "pi", combiner (sum, mean, sqrtn), ignore (the id skipped, -1) | p0: (V, D) | ids int32/int64; output (D,): a feature column's embedding, sparse gradient |
| sample_gather | x (L, D...), indices (...) | — (tf.gather(x, indices, batch_dims=1): each sample's rows; attr depth r: indices (..., r) coordinates into x's first r axes, tf.gather_nd with the batch index) | — | x float32, int32, int64 or bool (the output's); indices int32/int64 in [0, L); output indices + (D...) |
| batch_norm_inference | x (..., C) | epsilon, scale, center (bools: the optional weights), fused (FusedBatchNorm's order) | mean, variance (frozen), scale, offset: (C,) | |
| batch_norm_training | x (..., C) | epsilon, scale, center; mean_rule, variance_rule (affine: v * a + s * b, delta: v - (v - s) * d) with mean_update, variance_update their constants (empty: not moved) | scale, offset; moving_mean, moving_variance (frozen) when moved: (C,) | a batch barrier (`batch_barrier`) |
| in_batch_matmul | q (n,), d (n,) with transpose_b; p (B,), v (n,) without | transpose_b, batch_size B | — | a batch barrier: output (B,) (rows of q d^T) or (n,) (rows of p v) |
| batch_transpose | x (B,) | batch_size B | — | any float32; a batch barrier: row j of the result is column j of the batch's [B, B] |
| sample_constant | any value of the micro-batch (no gradient) | value (the batch first: B rows) | — | output value's dtype: the micro-batch's own rows |
| lrn | x (..., C) | depth_radius, bias, alpha, beta | — | float32: TF's LRN and LRNGrad over the last axis |
| dropout | x | rate, noise_shape (per sample, 1 where one decision is shared) | — | |
| random | any value of the micro-batch (its size only; no gradient) | distribution: normal, truncated_normal (abs < 2), uniform ([0, 1)); shape [per sample] | — | any input; output float32, drawn in every mode |
| categorical | logits (classes,), or (k, classes): a sample's k folded rows | num_samples; output: int32, int64 (tf.random.categorical: TF's CPU inverse CDF at the region's own uniform numbers, the rows in sample order) | — | logits float32; output (num_samples,), or (k, num_samples), attr output, drawn in every mode, no gradient |
| schedule | any value of the micro-batch (its size only; no gradient) | program (one scalar program of wafer.schedules of the global step and constants, as JSON) | — | any input; output () float32: the program's value at the step computed (evaluation: the checkpoint's) |
| broadcast | any value of the micro-batch (its size only; no gradient) | shape [per sample], value [the weight's TF shape: a leading 1 or fewer axes] | value: attr value (its gradient summed over the batch) | any input; output float32 |
| reshape | x | shape [per-sample target shape] (flatten = reshape to [n]) | — | any, passed through |
| add | x1, x2, ... same shape | — | — | |
| concat | x1, x2, ... | axis (per-sample axis, >= 0) | — | any, all one |
| softmax_cross_entropy_with_logits | logits (..., k), labels | sparse (bool) | — | labels (..., k) float32, or sparse (...) int32/int64; output (...) |
| softmax_cross_entropy_backprop | logits (..., k), labels | sparse (bool) | — | as softmax_cross_entropy_with_logits; output (..., k): softmax - labels, the fused op's second output (no gradient to the labels, as TF's) |
| loss | t (any) | scale, loss_scale (the backward's seed factor, default 1) | — | output () = scale * sum(t) |
| batch_tail_loss | the values a loss tail reads (any shapes) | steps (the tail: kernels on the whole batch as one sample, JSON; array attrs `<step>/<key>`), batch_size B, loss_scale | — | float32; a batch barrier and the loss: output () per sample, the batch's loss on its first |
| einsum | the `i` operands | equation (batch letter first in per-sample operands), operands | p<k>: attr p<k> | |
| fake_quant | x (the `i` operand 0) | operands (3 letters: x, min, max), num_bits, narrow_range, form (args, vars, per_channel) | min, max: attr p<k> (() or (C,) per channel) | tf.quantization.fake_quant_with_min_max_* bit for bit; min/max gradients as FakeQuant*Gradient |

Operands (binary, select, matmul, gather): attr `operands` has
a letter per operand position k, `i` the kernel's next input, `c` the constant in tensor
attr `c<k>`, `p` the weight with param role `p<k>` and TF shape in ints attr `p<k>`; they
broadcast as numpy (= TF) does on the micro-batch arrays (`wafer.kernels.operands`),
matmul's leading axes as BatchMatMulV2's (`wafer.kernels.matmul`: never into the batch).

The loss kernel (`is_loss = True`) outputs one value per sample, already scaled so that
the sum over the whole batch is the loss. Its backward takes no upstream gradient and
returns the gradient of that scaled value, so micro-batches add up to ordinary mini-batch
training.
Any kernel may carry attr `precision` "float16": it computes a float16 tensor of the
user's graph as `wafer.precision` says (operands and result rounded to float16, float32
arithmetic inside); its values still travel as float32 arrays.

`input_differentiable` says which inputs a gradient flows back through (not labels,
integer or bool inputs, comparisons, stop_gradient, one_hot, casts to non-float).
"""
from wafer.kernels import (  # noqa: F401
                             activation_grads,
                             activations,
                             batch_tail,
                             candidate_sampling,
                             complex_values,
                             conv,
                             conv_transpose,
                             dense,
                             depthwise,
                             determinants,
                             einsum,
                             elementwise,
                             embedding,
                             in_batch,
                             linear_systems,
                             local_response,
                             losses,
                             matmul,
                             normalization,
                             quantization,
                             random_numbers,
                             resampling,
                             spectral,
                             step_values,
                             structure,
                             tensor_ops,
                             volume,
)
from wafer.kernels.base import KERNELS, Kernel, KernelError, RunContext, build_kernel, register

__all__ = ["KERNELS", "Kernel", "KernelError", "RunContext", "build_kernel", "register"]
