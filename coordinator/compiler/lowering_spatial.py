"""Lowerings of the spatial ops beyond conv2d and pooling: transposed convolution
(Conv2DBackpropInput), depthwise convolution (DepthwiseConv2dNative), dilated convolution
(TF's SpaceToBatchND -> conv -> BatchToSpaceND), tiling within a sample (Keras UpSampling's
repeat), image resizing, and 3-D convolution and pooling. Each handler (registered in
`rules.GENERIC`) lowers its op onto a library kernel, or returns why it cannot (the per-sample proof is in the checks:
the batch axis is never tiled, resized or moved)."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

from coordinator.compiler import filters
from coordinator.compiler.ir import KernelNode
from coordinator.compiler.operands import static_shape
from coordinator.compiler.rules import Context, GenericRule, generic

# The README's rows: kernel -> the TF ops and Keras layers it computes.
KERNEL_ROWS = {
    "conv2d_transpose": "Conv2DBackpropInput (Keras Conv2DTranspose, Conv1DTranspose: NHWC, "
                        "SAME/VALID, strides, output_padding; float16 too)",
    "depthwise_conv2d, conv2d (dilated)": "DepthwiseConv2dNative (Keras DepthwiseConv2D, "
                                          "SeparableConv2D, their 1-D forms: depth multiplier, "
                                          "strides), dilation_rate (SpaceToBatchND -> Conv2D or "
                                          "DepthwiseConv2dNative -> BatchToSpaceND; Keras Conv1D's "
                                          "with ExpandDims and Squeeze around the Conv2D; "
                                          "float16 too); by a weight or a constant filter "
                                          "(tf.image.ssim's Gaussian window, "
                                          "tf.image.sobel_edges, a blur-pool; float16 too)",
    "conv3d, max_pool3d, avg_pool3d": "Conv3D, MaxPool3D, AvgPool3D (NDHWC, SAME/VALID, strides: "
                                      "Keras Conv3D, MaxPooling3D, AveragePooling3D; Conv3D by "
                                      "a weight or a constant filter; Conv3D in float16 too: "
                                      "float32 sums rounded once, where TF's Eigen kernels sum "
                                      "in float16)",
    "reshape, transpose (pixel shuffle)": "DepthToSpace, SpaceToDepth (tf.nn.depth_to_space, "
                                          "space_to_depth: NHWC; ESPCN's sub-pixel upsampling, "
                                          "YOLO's reorg): reshape, transpose, reshape",
    "pad, reshape, take (patches)": "ExtractImagePatches (tf.image.extract_patches: ViT's "
                                    "patches; SAME/VALID, strides, rates)",
    "lrn": "LRN (tf.nn.local_response_normalization / tf.nn.lrn over the channels: AlexNet, "
           "the TF1 CIFAR-10 tutorial; float32)",
    "tile, resize": "Tile within a sample (Keras UpSampling1D/2D/3D nearest; float16 too), ResizeBilinear, "
                    "ResizeNearestNeighbor (tf.image.resize, UpSampling2D bilinear; float16 too)",
}

TRANSPOSED_3D = ("3-D transposed convolution (Conv3DTranspose) has no CS kernel: upsample with "
                 "UpSampling3D, then Conv3D")
CROP_AND_RESIZE = ("tf.image.crop_and_resize (CropAndResize) has no CS kernel: its rows are "
                   "boxes, each reading the image its box index names at positions computed "
                   "from values, not samples: crop in input_fn, or resize a constant slice "
                   "(tf.image.resize(x[:, a:b, c:d], size))")
HALF_DEPTHWISE = ("DepthwiseConv2dNative in float16 (mixed precision) is carried out "
                  "without dilation, SAME or VALID padding: give this layer dtype='float32'")
REFUSED = {"Conv3DTranspose": TRANSPOSED_3D, "CropAndResize": CROP_AND_RESIZE}
# What to use instead of ops no kernel computes, by op type (coordinator.compiler.refusals).
INSTEAD = {"Conv3DBackpropInputV2": TRANSPOSED_3D, "CropAndResize": CROP_AND_RESIZE,
           "ImageProjectiveTransformV3": (
               "Keras RandomRotation, RandomTranslation, RandomZoom and RandomShear transform each "
               "image by random values: augment in input_fn (dataset.map), as TF's input pipelines do"),
           "ResizeBicubic": ("bicubic resizing has no CS kernel: resize with method='bilinear' or "
                             "'nearest', or bicubically in input_fn"),
           "ResizeArea": "area resizing has no CS kernel: resize with method='bilinear' or 'nearest'",
           "LookupTableFindV2": ("a vocabulary lookup (Keras IntegerLookup, StringLookup, tf.lookup "
                                 "tables) has no CS kernel: map the ids in input_fn and feed the "
                                 "indices")}


def _nhwc(op: tf.Operation) -> str:
    if op.get_attr("data_format") != b"NHWC":
        return f"{op.type} needs NHWC data"
    strides = list(op.get_attr("strides"))
    if strides[0] != 1 or strides[3] != 1:
        return f"{op.type} strides the batch or channel axis"
    return ""


def _padding(op: tf.Operation) -> str | list[int]:
    padding = op.get_attr("padding").decode()
    if padding == "EXPLICIT":
        pads = list(op.get_attr("explicit_paddings"))
        if any(pads[:2]) or any(pads[6:]):
            return "pads the batch or channel axis"
        return [int(p) for p in pads[2:6]]
    return padding


def _conv_transpose(m: Context, op: tf.Operation) -> str:
    sizes_t, filter_t, x = op.inputs
    weight, sizes = m.operands.weight(filter_t), m.operands.constant(sizes_t)
    shaped = sizes_t.op.inputs[sizes_t.value_index] if sizes_t.op.type == "ShapeN" else None
    if sizes is None and shaped is not None and shaped.shape.is_fully_defined():
        sizes = np.array(static_shape(shaped))  # a Conv2D's gradient (tf.gradients in the loss)
    if not m.is_batched(x) or weight is None or sizes is None:
        return "a transposed convolution of the samples by a weight, to a constant size, is supported"
    bad = _nhwc(op)
    if bad:
        return bad
    if list(op.get_attr("dilations")) != [1, 1, 1, 1]:
        return "dilated transposed convolutions are not supported (nor computed by TF's CPU)"
    padding = _padding(op)
    if padding not in ("SAME", "VALID"):
        return "a transposed convolution needs SAME or VALID padding"
    if int(sizes[0]) != m.batch_size:
        return "the transposed convolution's output batch differs from its input's"
    strides = list(op.get_attr("strides"))
    kh, kw, count, _ = weight.shape
    m.add_kernel(m.scope(op, weight.variable), "conv2d_transpose", [x], {
        "filters": int(count), "kernel_size": [int(kh), int(kw)],
        "strides": [int(strides[1]), int(strides[2])], "padding": padding,
        "output_size": [int(sizes[1]), int(sizes[2])]}, filters.of_weight(weight).params(), [op],
        op.outputs[0])
    return ""


def _conv(m: Context, op: tf.Operation, x: tf.Tensor, ops: list[tf.Operation],
          out: tf.Tensor, padding: str | list[int], dilations: list[int]) -> str:
    """Conv2D or DepthwiseConv2dNative `op` of the samples `x` (through `ops`) by a weight."""
    kernel = _conv_kernel(m, op, x, ops, out, padding, dilations)
    return kernel if isinstance(kernel, str) else ""


def _conv_kernel(m: Context, op: tf.Operation, x: tf.Tensor | str, ops: list[tf.Operation],
                 out: tf.Tensor | tuple[int, ...], padding: str | list[int],
                 dilations: list[int]) -> KernelNode | str:
    """_conv's kernel, or why not; `x` may be a kernel's name, and `out` the per-sample
    shape of an intermediate result that a kernel after it reads."""
    if not (isinstance(x, str) or m.is_batched(x)):
        return f"{op.type} of a value that is not per-sample (a constant image) has no CS kernel"
    found = filters.find(m, op, op.inputs[1])
    if isinstance(found, str):
        return found
    bad = _nhwc(op)
    if bad:
        return bad
    strides = list(op.get_attr("strides"))
    kh, kw = found.shape[:2]
    attrs: dict[str, Any] = {"kernel_size": [int(kh), int(kw)], "padding": padding,
                             "strides": [int(strides[1]), int(strides[2])], "dilations": dilations,
                             **found.attrs()}
    if op.type == "Conv2D":
        attrs.update(filters=int(found.shape[3]), use_bias=False, activation="linear")
        kind = "conv2d"
    else:
        attrs["depth_multiplier"] = int(found.shape[3])
        kind = "depthwise_conv2d"
    base = m.scope(op, found.variable)
    if isinstance(out, tf.Tensor):
        return m.add_kernel(base, kind, [x], attrs, found.params(), ops, out)
    return m.add_kernel(base, kind, [x], attrs, found.params(), ops, None, output_shape=out,
                        source_op=op)


def _depthwise(m: Context, op: tf.Operation) -> str:
    padding = _padding(op)
    if not isinstance(padding, list) and padding not in ("SAME", "VALID"):
        return padding
    dilations = list(op.get_attr("dilations"))
    if dilations[0] != 1 or dilations[3] != 1:
        return "dilates the batch or channel axis"
    return _conv(m, op, op.inputs[0], [op], op.outputs[0], padding, [int(d) for d in dilations[1:3]])


def _space_to_batch(m: Context, op: tf.Operation) -> str:
    """TF's dilated convolution: x padded and split into block-strided phases on the batch
    axis, a VALID convolution, the phases put back and cropped. Together they compute a
    dilated convolution of each sample with padding (before - crop, after - crop). The 1-D
    form (Keras Conv1D with dilation_rate: tf.nn.conv1d's ExpandDims -> Conv2D -> Squeeze
    between the two) is the 2-D one over a height of 1."""
    why = ("moves values into the batch axis (SpaceToBatchND); only TF's dilated convolution "
           "(SpaceToBatchND, Conv2D or DepthwiseConv2dNative, BatchToSpaceND; for Conv1D with "
           "ExpandDims and Squeeze around the Conv2D) is supported")
    block, paddings = (m.operands.constant(t) for t in op.inputs[1:3])
    if block is None or paddings is None or block.shape not in ((1,), (2,)):
        return why
    one_d = block.shape == (1,)
    chain = _dilated_chain(m, op, one_d)
    if chain is None:
        return why
    conv, back = chain[-3 if one_d else -2], chain[-1]
    if conv.type == "DepthwiseConv2dNative" and conv.outputs[0].dtype.base_dtype == tf.float16:
        return HALF_DEPTHWISE  # Eigen's float16 depthwise kernel, reproduced without dilation
    back_block, crops = (m.operands.constant(t) for t in back.inputs[1:3])
    if back_block is None or crops is None or not np.array_equal(back_block, block):
        return why
    pads = (np.asarray(paddings) - np.asarray(crops)).ravel()
    if (pads < 0).any():
        return "a dilated convolution whose crops exceed its padding"
    if not one_d:
        return _conv(m, conv, op.inputs[0], chain, back.outputs[0], [int(p) for p in pads],
                     [int(b) for b in block])
    # [W, C] -> [1, W, C], the 2-D convolution over a height of 1, -> [W', F]
    x = op.inputs[0]
    rows = m.add_kernel(f"{op.name}/expand", "reshape", [x], {"shape": [1, *m.shape(x)]}, [], [],
                        None, output_shape=(1, *m.shape(x)), source_op=conv)
    kernel = _conv_kernel(m, conv, rows.name, chain[:-2], (1, *static_shape(back.outputs[0])[1:]),
                          [0, 0, *(int(p) for p in pads)], [1, int(block[0])])
    if isinstance(kernel, str):
        return kernel
    m.add_kernel(back.name, "reshape", [kernel.name],
                 {"shape": list(static_shape(back.outputs[0])[1:])}, [], chain[-2:], back.outputs[0])
    return ""


def _dilated_chain(m: Context, op: tf.Operation, one_d: bool) -> list[tf.Operation] | None:
    """The ops of TF's dilated convolution from SpaceToBatchND `op` to its BatchToSpaceND,
    each the sole reader of the one before (None if they are not that)."""
    kinds = ["ExpandDims", "Conv2D", "Squeeze", "BatchToSpaceND"] if one_d else \
        ["Conv2D", "BatchToSpaceND"]
    chain, tensor = [op], op.outputs[0]
    for kind in kinds:
        user = m.sole_consumer(tensor)
        if user is None or not (user.type == kind or kind == "Conv2D" and user.type ==
                                "DepthwiseConv2dNative") or user.inputs[0] is not tensor:
            return None
        chain.append(user)
        tensor = user.outputs[0]
    conv = chain[-3 if one_d else -2]
    if conv.get_attr("padding") != b"VALID" or list(conv.get_attr("strides")) != [1, 1, 1, 1] or \
            list(conv.get_attr("dilations")) != [1, 1, 1, 1]:
        return None
    if one_d and (len(static_shape(chain[1].outputs[0])) != 4 or static_shape(chain[1].outputs[0])[1] != 1
                  or static_shape(chain[3].outputs[0]) != static_shape(chain[2].outputs[0])[:1] +
                  static_shape(chain[2].outputs[0])[2:]):
        return None
    return chain


def _tile(m: Context, op: tf.Operation) -> str:
    multiples = m.operands.constant(op.inputs[1])
    if not m.is_batched(op.inputs[0]) or multiples is None:
        return "tiles by multiples that are not constant, or a value that is not per-sample"
    if int(multiples[0]) != 1:
        return "tiles the batch axis (copies of samples): tile within each sample"
    shift = m.axis_shift(op.inputs[0])  # (folded rows: their multiple 1 kept, each sample's k)
    m.add_kernel(op.name, "tile", [op.inputs[0]],
                 {"multiples": [int(k) for k in multiples[shift:]]}, [], [op], op.outputs[0])
    return ""


@generic("DepthToSpace", "SpaceToDepth")
def _pixel_shuffle(m: Context, op: tf.Operation) -> str:
    """[H, W, b·b·C] <-> [H·b, W·b, C] of each sample as reshape, transpose, reshape: the
    depth holds (row offset, column offset, channel) in that order (TF's NHWC layout). A
    rearrangement: its gradient, the inverse one, is TF's (SpaceToDepth of the gradient,
    and back), in float16 too."""
    x, block = op.inputs[0], int(op.get_attr("block_size"))
    if not m.is_batched(x) or op.get_attr("data_format") != b"NHWC" or len(static_shape(x)) != 4:
        return f"{op.type} of per-sample NHWC images is supported"
    if op.type == "DepthToSpace":
        h, w, depth = static_shape(x)[1:]
        split, moved = (h, w, block, block, depth // (block * block)), (h, block, w, block, depth // (block * block))
    else:
        h, w, depth = static_shape(op.outputs[0])[1:]
        split, moved = (h, block, w, block, depth // (block * block)), (h, w, block, block, depth // (block * block))
    first = m.add_kernel(f"{op.name}/split", "reshape", [x], {"shape": list(split)}, [], [], None,
                         output_shape=split, source_op=op)
    swapped = m.add_kernel(f"{op.name}/transpose", "transpose", [first.name],
                           {"perm": [0, 2, 1, 3, 4]}, [], [], None, output_shape=moved, source_op=op)
    m.add_kernel(op.name, "reshape", [swapped.name], {"shape": list(static_shape(op.outputs[0])[1:])},
                 [], [op], op.outputs[0])
    return ""


def patch_positions(size: int, kernel: int, stride: int, rate: int, padding: str) -> tuple[list[int], int]:
    """ExtractImagePatches along one axis: each (output, tap)'s row of the padded axis, in
    output-major order, and the padding before (TF's GetWindowedOutputSize)."""
    span = (kernel - 1) * rate + 1
    if padding == "VALID":
        out, before = (size - span) // stride + 1, 0
    else:
        out = -(-size // stride)
        before = max((out - 1) * stride + span - size, 0) // 2
    return [o * stride + t * rate for o in range(out) for t in range(kernel)], before


@generic("ExtractImagePatches")
def _extract_patches(m: Context, op: tf.Operation) -> str:
    """tf.image.extract_patches of per-sample images (ViT's patches): the image padded (SAME),
    flattened to [H·W, C], each patch's pixels taken in TF's order (row tap, column tap,
    channel) and reshaped to [out rows, out columns, kh·kw·C]; the gradient is take's, the
    sum of each pixel's copies (TF's _ExtractImagePatchesGrad sums them likewise)."""
    x = op.inputs[0]
    ksizes, strides, rates = (list(op.get_attr(a)) for a in ("ksizes", "strides", "rates"))
    padding = op.get_attr("padding").decode()
    if not m.is_batched(x) or len(static_shape(x)) != 4 or padding not in ("SAME", "VALID") or \
            ksizes[0] != 1 or ksizes[3] != 1 or strides[0] != 1 or strides[3] != 1:
        return "ExtractImagePatches of per-sample images over rows and columns is supported"
    h, w, c = static_shape(x)[1:]
    rows, top = patch_positions(h, ksizes[1], strides[1], rates[1], padding)
    cols, left = patch_positions(w, ksizes[2], strides[2], rates[2], padding)
    padded_h = max(max(rows) + 1, h + top)
    padded_w = max(max(cols) + 1, w + left)
    source: tf.Tensor | str = x
    if (padded_h, padded_w) != (h, w):
        source = m.add_kernel(f"{op.name}/pad", "pad", [x], {"paddings": [
            top, padded_h - h - top, left, padded_w - w - left, 0, 0]}, [], [], None,
            output_shape=(padded_h, padded_w, c), source_op=op).name
    flat = m.add_kernel(f"{op.name}/pixels", "reshape", [source], {"shape": [padded_h * padded_w, c]},
                        [], [], None, output_shape=(padded_h * padded_w, c), source_op=op)
    kh, kw = ksizes[1], ksizes[2]
    out_h, out_w = len(rows) // kh, len(cols) // kw
    index = (np.asarray(rows).reshape(out_h, 1, kh, 1) * padded_w +
             np.asarray(cols).reshape(1, out_w, 1, kw)).ravel()
    taken = m.add_kernel(f"{op.name}/take", "take", [flat.name], {"axis": 0, "indices": [
        int(i) for i in index]}, [], [], None, output_shape=(len(index), c), source_op=op)
    m.add_kernel(op.name, "reshape", [taken.name], {"shape": list(static_shape(op.outputs[0])[1:])},
                 [], [op], op.outputs[0])
    return ""


def _lrn(m: Context, op: tf.Operation) -> str:
    """LRN (tf.nn.local_response_normalization) over the channels of per-sample images."""
    if not m.is_batched(op.inputs[0]):
        return "local response normalization of per-sample images is supported"
    m.add_kernel(op.name, "lrn", [op.inputs[0]], {
        "depth_radius": int(op.get_attr("depth_radius")), "bias": float(op.get_attr("bias")),
        "alpha": float(op.get_attr("alpha")), "beta": float(op.get_attr("beta"))},
        [], [op], op.outputs[0])
    return ""


def _resize(m: Context, op: tf.Operation) -> str:
    size = m.operands.constant(op.inputs[1])
    if not m.is_batched(op.inputs[0]) or size is None or len(static_shape(op.inputs[0])) != 4:
        return "resizes to a size that is not constant, or a value that is not per-sample images"
    m.add_kernel(op.name, "resize", [op.inputs[0]], {
        "size": [int(s) for s in size], "method": "bilinear" if op.type == "ResizeBilinear" else "nearest",
        "align_corners": bool(op.get_attr("align_corners")),
        "half_pixel_centers": bool(op.get_attr("half_pixel_centers"))}, [], [op], op.outputs[0])
    return ""


@functools.cache
def max_pool3d_ties() -> str:
    """How this host's TF routes MaxPool3DGrad's gradient among tied values, as the CPU path
    trains: "first" (oneDNN's kernel, on by default on CPUs with AVX-512) or "near" (Eigen's,
    TF_ENABLE_ONEDNN_OPTS=0 or an older CPU). Probed once in a session on two equal values
    fed (a constant would be folded by Grappler with Eigen's kernel)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1, 1, 1, 2, 1])
        grad = tf.gradients(tf.nn.max_pool3d(x, [1, 1, 1, 2, 1], [1] * 5, "VALID"), x)[0]
    with tf.compat.v1.Session(graph=graph) as session:
        routed = session.run(grad, {x: np.zeros([1, 1, 1, 2, 1], np.float32)}).ravel()
    return "near" if routed[1] else "first"


def _volume(m: Context, op: tf.Operation) -> str:
    """Conv3D, MaxPool3D, AvgPool3D on per-sample (D, H, W, C) volumes."""
    x = op.inputs[0]
    strides = list(op.get_attr("strides"))
    padding = op.get_attr("padding").decode()
    if not m.is_batched(x) or op.get_attr("data_format") != b"NDHWC" or \
            strides[0] != 1 or strides[4] != 1 or padding not in ("SAME", "VALID"):
        return f"{op.type} needs per-sample NDHWC volumes, SAME or VALID padding, strides over D, H, W"
    attrs: dict[str, Any] = {"strides": [int(s) for s in strides[1:4]], "padding": padding}
    if op.type != "Conv3D":
        ksize = list(op.get_attr("ksize"))
        if ksize[0] != 1 or ksize[4] != 1:
            return "pools over the batch or channel axis"
        attrs["pool_size"] = [int(k) for k in ksize[1:4]]
        if op.type == "MaxPool3D":
            attrs["ties"] = max_pool3d_ties()
        m.add_kernel(op.name, "max_pool3d" if op.type == "MaxPool3D" else "avg_pool3d", [x],
                     attrs, [], [op], op.outputs[0])
        return ""
    if list(op.get_attr("dilations")) != [1] * 5:
        return "a dilated Conv3D has no CS kernel: use dilation_rate 1"
    found = filters.find(m, op, op.inputs[1])
    if isinstance(found, str):
        return found
    attrs.update(filters=int(found.shape[4]), kernel_size=[int(k) for k in found.shape[:3]],
                 **found.attrs())
    m.add_kernel(m.scope(op, found.variable), "conv3d", [x], attrs, found.params(), [op],
                 op.outputs[0])
    return ""


NO_HALF_CPU_KERNEL = ("MaxPool3D", "AvgPool3D")


def _float32_only(handler: GenericRule) -> GenericRule:
    """These kernels are proven against TF's float32 kernels only: a float16 op (mixed
    precision) is refused rather than computed with other rounding than TF's."""
    def lower(m: Context, op: tf.Operation) -> str:
        if any(t.dtype.base_dtype == tf.float16 for t in op.outputs):
            if op.type in NO_HALF_CPU_KERNEL:
                return (f"{op.type} in float16 (mixed precision) has no TF CPU kernel (TF 2.21 "
                        "registers it for float32 only: the CPU path cannot run it either): give "
                        "this layer dtype='float32'")
            return (f"{op.type} in float16 (mixed precision) is not proven against TF's float16 "
                    "kernel on the CS: give this layer dtype='float32'")
        return handler(m, op)
    return lower


def _depthwise_in_half(m: Context, op: tf.Operation) -> str:
    """DepthwiseConv2dNative, float16 too: as TF's Eigen float16 kernels compute it
    (wafer.kernels.depthwise) without dilation, SAME or VALID."""
    if op.outputs[0].dtype.base_dtype == tf.float16 and (
            list(op.get_attr("dilations")) != [1] * 4
            or op.get_attr("padding") not in (b"SAME", b"VALID")):
        return HALF_DEPTHWISE
    return _depthwise(m, op)


generic("DepthwiseConv2dNative")(_depthwise_in_half)
generic("Tile")(_tile)  # float16 too: copies; the gradient's sum over copies in float32
# float16 too: float32 sums rounded once (docs/design.md, "Mixed precision")
generic("SpaceToBatchND")(_space_to_batch)
generic("Conv2DBackpropInput")(_conv_transpose)
# float16 too: ResizeBilinear outputs float32 (its gradient the float32 one rounded once, as
# the CS's), ResizeNearestNeighbor copies (its gradient rounded as TF's: wafer.kernels.resampling)
generic("ResizeBilinear", "ResizeNearestNeighbor")(_resize)
# float16 too: float32 sums rounded once, as conv2d's; TF's CPU Conv3D and its backprops sum
# in float16 (Eigen's CuboidConvolution on Eigen::half: docs/design.md, "Mixed precision")
generic("Conv3D")(_volume)
for op_types, rule in ((("MaxPool3D", "AvgPool3D"), _volume), (("LRN",), _lrn)):
    generic(*op_types)(_float32_only(rule))
