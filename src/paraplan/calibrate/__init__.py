"""Calibration: fit the analytical cost model's free parameters to measured samples.

- ``calibrate_operators`` fits a GPU's ``EfficiencySpec`` (gemm, attention and memory curves,
  kernel overhead, per-operator curves) to GPUModeling single-operator timings
  (``operators``: samples, ``params``: the parameter vector, ``efficiency``: the fit, ``gpu``:
  hold-out, comparison and final fit);
- ``calibrate_links`` fits a cluster's link efficiency, p2p efficiency and latency to NCCL
  timings (``links``: samples and fit, ``cluster``: topologies and hold-out);
- ``catalog_yaml`` writes the fitted numbers as catalog YAML.

Every prediction goes through the cost model (``estimate_op_s``, ``estimate_collective_s``),
so the fitted numbers mean exactly what the cost model does with them. The functions return
data and never print; ``paraplan calibrate`` renders it (docs/calibration.md). scipy and pandas
(``pip install -e ".[calibrate]"``) are imported when a fit or a load runs, not on import.
"""

from paraplan.calibrate._common import ErrorStats, check_dependencies
from paraplan.calibrate.catalog_yaml import (
    catalog_file,
    cluster_file_yaml,
    efficiency_yaml,
    links_yaml,
    replace_efficiency_block,
    write_new_file,
)
from paraplan.calibrate.cluster import LinkCalibration, LinkOptions, calibrate_links
from paraplan.calibrate.efficiency import fit_efficiency
from paraplan.calibrate.errors import AchievedRow, ErrorRow, achieved_rows, error_rows
from paraplan.calibrate.gpu import EfficiencyFit, OperatorCalibration, OperatorOptions, calibrate_operators
from paraplan.calibrate.links import CollSamples, fit_links, load_collective_samples, predict_colls
from paraplan.calibrate.operators import (
    DEFAULT_MEMORY_TAGS,
    OP_CURVE_MODES,
    SOFTMAX_TAGS,
    OpSamples,
    load_operator_samples,
    op_curve_keys,
    predict_ops,
)
from paraplan.calibrate.params import ParamLayout

__all__ = [
    "DEFAULT_MEMORY_TAGS",
    "OP_CURVE_MODES",
    "SOFTMAX_TAGS",
    "AchievedRow",
    "CollSamples",
    "EfficiencyFit",
    "ErrorRow",
    "ErrorStats",
    "LinkCalibration",
    "LinkOptions",
    "OpSamples",
    "OperatorCalibration",
    "OperatorOptions",
    "ParamLayout",
    "achieved_rows",
    "calibrate_links",
    "calibrate_operators",
    "catalog_file",
    "check_dependencies",
    "cluster_file_yaml",
    "efficiency_yaml",
    "error_rows",
    "fit_efficiency",
    "fit_links",
    "links_yaml",
    "load_collective_samples",
    "load_operator_samples",
    "op_curve_keys",
    "predict_colls",
    "predict_ops",
    "replace_efficiency_block",
    "write_new_file",
]
