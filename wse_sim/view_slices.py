"""The IndexedSlices of a table TF updates sparsely that the kernels read through one static
view holding each element of a gather at constant indices once (T5's relative-position bias:
tf.gather(table, buckets), transposed): its k-th occurrence of row r is the k-th appearance,
in view order, of each of r's elements. The rows are the gather's indices and each slice one
of its output rows (up to order): what TF's optimizer deduplicates and applies."""
from __future__ import annotations

import numpy as np


def _occurrences(view: np.ndarray, row: int) -> tuple[np.ndarray, np.ndarray]:
    """Each view element's (row, occurrence number of its flat index in view order)."""
    flat = view.reshape(-1)
    order = np.argsort(flat, kind="stable")
    ranked = flat[order]
    seen = np.empty(flat.size, np.int64)
    seen[order] = np.arange(flat.size) - np.searchsorted(ranked, ranked, side="left")
    return flat // row, seen


def whole_rows_problem(view: np.ndarray, row: int) -> str:
    """Why `view` (flat indices into a table of `row` elements a row) is not whole rows of a
    gather ("" if it is): every element of a row it names appears as often as the others."""
    flat = view.reshape(-1)
    counts = np.bincount(flat, minlength=(int(flat.max(initial=-1)) // row + 1) * row)
    per_row = counts.reshape(-1, row)
    if np.any(per_row != per_row[:, :1]):
        return ("a sparse (IndexedSlices) update of a viewed table needs each row it names "
                "read whole, as often as each of the row's elements")
    return ""


def view_slices(view: np.ndarray, grad: np.ndarray, row_shape: tuple[int, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """The (ids, values) of the view's gradient `grad` (the view's shape): one slice per
    occurrence of a row, rows ascending, occurrences in view order."""
    row = int(np.prod(row_shape, dtype=np.int64))
    rows, seen = _occurrences(view, row)
    slices = int(seen.max(initial=-1)) + 1
    keys, slice_of = np.unique(rows * slices + seen, return_inverse=True)
    values = np.zeros((keys.size, row), np.float32)
    values[slice_of, view.reshape(-1) % row] = grad.reshape(-1)
    return keys // slices, values.reshape((keys.size, *row_shape))
