"""The embedded catalog of GPU types and LLMs, plus user catalogs."""

from energyopt.catalog.loader import Catalog, builtin_catalog, load_catalog_file
from energyopt.catalog.problem import Problem, load_problem, resolve

__all__ = ["Catalog", "Problem", "builtin_catalog", "load_catalog_file", "load_problem", "resolve"]
