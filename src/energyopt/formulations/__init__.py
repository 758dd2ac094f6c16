"""What every family's formulations share: the errors a formulation raises (``errors``)
and sparse constraint rows (``sparse_rows``). Each family's formulations live in its
package under ``energyopt.families``."""
