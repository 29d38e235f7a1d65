"""Workflow variables: handles to data that tasks pass to each other."""

from michelangelo.workflow.variables._dataset_io import register_dataset_io
from michelangelo.workflow.variables._dataset_variable import DatasetVariable

__all__ = ["DatasetVariable", "register_dataset_io"]

register_dataset_io()  # DatasetVariables and Ray Datasets are stored as Parquet
