"""Tree validators: whether the trees of a loaded model can be walked safely. XGBoost's tree
loader and scikit-learn's ``predict`` follow child, parent and feature indices without bounds
checks, so a crafted model file could make them read out of bounds; these checks say why a
model is refused (a one-line reason), or None."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_INT_ARRAYS = ("left_children", "right_children", "parents", "split_indices")
_FLOAT_ARRAYS = ("split_conditions", "base_weights", "loss_changes", "sum_hessian")
_CATEGORY_ARRAYS = ("categories", "categories_nodes", "categories_segments", "categories_sizes")
_ROOT_PARENT = 2**31 - 1  # XGBoost's "no parent" (-1 without its left-child flag bit)
_BASE_SCORE = re.compile(r"\[?[-+0-9.eE]{1,40}\]?")


def _count(value: Any) -> int:
    """A count XGBoost stores as a decimal string ("60")."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9):
        raise ValueError(f"{value!r} is not a count")
    return int(value)


def booster_problem(doc: Any, n_features: int) -> str | None:
    """Why the XGBoost model document cannot be loaded and walked safely, or None.

    Accepted: what paraplan fits (one squared-error regression target, one tree per round, numeric
    splits, no attributes) with every tree a proper binary tree: node arrays as long as
    ``num_nodes``, each inner node's children after it, within the tree and naming it as their
    parent, every node but the root some node's child, split features below ``n_features``, and
    finite thresholds and leaf values.
    """
    try:
        learner = doc["learner"]
        params = learner["learner_model_param"]
        if _count(params["num_feature"]) != n_features:
            return f"{params['num_feature']} features, the manifest names {n_features}"
        if params.get("num_target", "1") != "1" or params.get("num_class", "0") != "0":
            return "not a single-target regressor"
        if not _BASE_SCORE.fullmatch(str(params.get("base_score", "0"))):
            return "base_score is not a number"
        if learner["objective"]["name"] != "reg:squarederror":
            return f"objective {learner['objective']['name']!r} is not reg:squarederror"
        if learner.get("attributes", {}) != {}:
            return "unexpected booster attributes"
        for field in ("feature_names", "feature_types"):
            names = learner.get(field, [])
            if not (isinstance(names, list) and len(names) in (0, n_features)):
                return f"{field} does not match {n_features} features"
            if not all(isinstance(name, str) and name != "c" for name in names):
                return f"{field} must be strings, none categorical"
        booster = learner["gradient_booster"]
        if booster["name"] != "gbtree":
            return f"booster {booster['name']!r} is not gbtree"
        model = booster["model"]
        n_trees = _count(model["gbtree_model_param"]["num_trees"])
        if model["gbtree_model_param"].get("num_parallel_tree", "1") != "1":
            return "more than one tree per round"
        trees = model["trees"]
        if not isinstance(trees, list) or len(trees) != n_trees or n_trees < 1:
            return f"{n_trees} trees declared, {len(trees) if isinstance(trees, list) else 0} present"
        info = np.asarray(model["tree_info"])
        if info.shape != (n_trees,) or info.dtype.kind not in "iu" or info.any():
            return "tree_info does not assign every tree to the one output"
        if "iteration_indptr" in model:
            indptr = np.asarray(model["iteration_indptr"])
            if indptr.dtype.kind not in "iu" or not np.array_equal(indptr, np.arange(n_trees + 1)):
                return "iteration_indptr does not list one tree per round"
        cats = model.get("cats", {})
        if not isinstance(cats, dict) or any(len(v) for v in cats.values()):
            return "categorical features are not supported"
        return trees_problem(trees, n_features)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"unexpected layout: {short_error(exc)}"


def trees_problem(trees: list[Any], n_features: int) -> str | None:
    sizes, arrays = [], {name: [] for name in (*_INT_ARRAYS, *_FLOAT_ARRAYS, "default_left", "split_type")}
    for i, tree in enumerate(trees):
        param = tree["tree_param"]
        if tree["id"] != i or isinstance(tree["id"], bool):
            return f"tree {i} has id {tree['id']!r}"
        n = _count(param["num_nodes"])
        if n < 1 or _count(param["num_feature"]) != n_features:
            return f"tree {i} does not match {n_features} features"
        if param.get("num_deleted", "0") != "0" or param.get("size_leaf_vector", "1") not in ("0", "1"):
            return f"tree {i} has deleted nodes or vector leaves"
        for name in _CATEGORY_ARRAYS:
            if len(tree.get(name, ())):
                return f"tree {i} has categorical splits"
        for name, parts in arrays.items():
            values = np.asarray(tree.get(name, np.zeros(n, np.uint8)) if name == "split_type" else tree[name])
            if values.shape != (n,) or values.dtype.kind not in ("iu" if name in _INT_ARRAYS else "iufb"):
                return f"tree {i} has inconsistent node arrays"
            parts.append(values)
        sizes.append(n)
    # all trees at once: node j of tree t is row start[t] + j
    size = np.asarray(sizes)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    tree_of = np.repeat(np.arange(len(size)), size)
    own = np.arange(int(size.sum())) - start[tree_of]
    left, right, parent, feature = (np.concatenate(arrays[name]).astype(np.int64) for name in _INT_ARRAYS)
    inner = left != -1
    children_bad = inner != (right != -1)
    for child in (left, right):
        children_bad |= inner & ((child <= own) | (child >= size[tree_of]))
    with np.errstate(over="ignore", invalid="ignore"):  # XGBoost holds thresholds as float32
        finite = np.isfinite(np.concatenate(arrays["split_conditions"]).astype(np.float32))
    checks = (
        (children_bad, "a child index that is not a later node of the tree"),
        (inner & ((feature < 0) | (feature >= n_features)), f"a split feature outside 0..{n_features - 1}"),
        (~finite, "a NaN or infinite threshold or leaf value"),
        (np.concatenate(arrays["split_type"]) != 0, "a categorical split"),
        ((own == 0) & (parent != _ROOT_PARENT), "a root with a parent"),
    )
    for mask, what in checks:
        if mask.any():
            return f"tree {int(tree_of[np.argmax(mask)])} node {int(own[np.argmax(mask)])} has {what}"
    # each child names its parent, and every node but a root is exactly one node's child
    rows = np.flatnonzero(inner)
    for child in (left, right):
        at = start[tree_of[rows]] + child[rows]
        wrong = parent[at] != own[rows]
        if wrong.any():
            return f"tree {int(tree_of[rows[np.argmax(wrong)]])} has inconsistent parent indices"
    base = start[tree_of[rows]]
    children = np.bincount(np.concatenate([base + left[rows], base + right[rows]]), minlength=len(own))
    orphan = children != (own != 0)
    if orphan.any():
        return f"tree {int(tree_of[np.argmax(orphan)])} has nodes outside the tree"
    return None


def forest_problem(model: Any, n_features: int) -> str | None:
    """Why the forest's trees cannot be walked safely, or None.

    scikit-learn follows child and feature indices without bounds checks, so a crafted file
    could make ``predict`` read out of bounds. Fitted trees number children after their parent,
    which also rules out cycles.
    """
    from sklearn.tree import DecisionTreeRegressor

    trees = getattr(model, "estimators_", None)
    if not isinstance(trees, list) or not trees:
        return "no trees"
    if getattr(model, "n_outputs_", None) != 1:
        return "not a single-output regressor"
    for i, est in enumerate(trees):
        if type(est) is not DecisionTreeRegressor or not hasattr(est, "tree_"):
            return f"estimator {i} is not a fitted regression tree"
        tree = est.tree_
        n = int(tree.node_count)
        left, right, feature = tree.children_left, tree.children_right, tree.feature
        if n < 1 or not (len(left) == len(right) == len(feature) == n):
            return f"tree {i} has inconsistent node arrays"
        if tree.n_features != n_features or tree.n_outputs != 1 or tree.value.shape != (n, 1, 1):
            return f"tree {i} does not match {n_features} features and one output"
        leaf = left == -1
        inner = ~leaf
        own = np.arange(n)[inner]
        if (
            not np.array_equal(leaf, right == -1)
            or np.any(left[inner] <= own)
            or np.any(right[inner] <= own)
            or np.any(left[inner] >= n)
            or np.any(right[inner] >= n)
            or np.any(feature[inner] < 0)
            or np.any(feature[inner] >= n_features)
        ):
            return f"tree {i} has out-of-range node or feature indices"
    return None


def short_error(exc: BaseException) -> str:
    """The first line of an exception's message (its type when it has none), at most 160 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]
