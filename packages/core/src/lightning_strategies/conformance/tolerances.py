"""How closely two runs must agree, by precision: tight where the arithmetic is exact enough."""

_TOLERANCES = {"32-true": 1e-5, "32": 1e-5, "64-true": 1e-7}
_LOW_PRECISION_TOLERANCE = 2e-2


def tolerance_for(precision: str) -> float:
    return _TOLERANCES.get(str(precision), _LOW_PRECISION_TOLERANCE)
