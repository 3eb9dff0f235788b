"""Sample records: measured operator and collective timings in one schema, stored as Parquet.

``schema`` defines the columns (:func:`validate_samples`), ``store`` reads and writes files
(:func:`save_samples`, :func:`load_samples`), ``gpumodeling`` imports the GPUModeling25 CSV
layout with its data-quality rules (:func:`import_gpumodeling`). pandas and pyarrow are needed
(``pip install 'paraplan[learned]'``); ``import paraplan`` does not import this package.
"""

from paraplan.samples.gpumodeling import ImportResult, collective_for_row, import_gpumodeling
from paraplan.samples.schema import COLUMNS, SCHEMA_VERSION, empty_samples, validate_samples
from paraplan.samples.store import load_samples, read_samples_metadata, save_samples

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "ImportResult",
    "collective_for_row",
    "empty_samples",
    "import_gpumodeling",
    "load_samples",
    "read_samples_metadata",
    "save_samples",
    "validate_samples",
]
