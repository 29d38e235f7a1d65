"""Workflow variables: handles to data that tasks pass to each other."""

from michelangelo.workflow.variables._dataset_variable import DatasetVariable

# Registers the IO that stores DatasetVariables and Ray Datasets as Parquet.
from michelangelo.uniflow.plugins.ray import _dataset_io  # noqa: E402,F401  isort: skip

__all__ = ["DatasetVariable"]
