"""Workflow variables: handles to data that tasks pass to each other."""

# Importing the IO registers how DatasetVariables and Ray Datasets are stored (as Parquet).
from michelangelo.workflow.variables import _dataset_io  # noqa: F401  (registration)
from michelangelo.workflow.variables._dataset_variable import DatasetVariable

__all__ = ["DatasetVariable"]
