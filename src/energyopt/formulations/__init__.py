"""Problem families stated as mathematical programs (one sub-package per family)."""
