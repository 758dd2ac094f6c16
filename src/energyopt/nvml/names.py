"""Matching NVML product names to catalog GPU types."""

from __future__ import annotations

#: Catalog name -> the product name NVML reports for that board.
NVML_NAMES: dict[str, str] = {
    "A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB",
    "H100-SXM5-80GB": "NVIDIA H100 80GB HBM3",
    "H200-SXM-141GB": "NVIDIA H200",
    "L4": "NVIDIA L4",
    "L40S": "NVIDIA L40S",
}


def _norm(name: str) -> str:
    name = name.strip().upper()
    return name.removeprefix("NVIDIA ").strip()


def nvml_name(catalog_name: str) -> str:
    """The NVML product name of a catalog GPU type (a guess for unknown types)."""
    return NVML_NAMES.get(catalog_name, f"NVIDIA {catalog_name}")


def name_matches(catalog_name: str, device_name: str) -> bool:
    """Whether an NVML device called ``device_name`` is of the catalog type ``catalog_name``."""
    return _norm(device_name) in {_norm(catalog_name), _norm(nvml_name(catalog_name))}
