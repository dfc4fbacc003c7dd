"""Coefficient tables of the symplectic N-body integrators (the algorithm is `nbody.composition_step`).

Every scheme is a symmetric composition of leapfrog substeps with weights w_k (sum 1): a step of size h
runs leapfrog substeps of sizes w_1 h, w_2 h, ... in order. Symmetric weights give a time-reversible
symplectic method of even order. The leapfrog substep comes in two orderings:

- kick-drift-kick (KDK, dynaforge's default): v += h/2 a(x); x += h v; v += h/2 a(x). Consecutive
  half-kicks share one force evaluation, and the forces at the end of a step are those at its start of
  the next (first same as last), so a step costs `len(weights)` evaluations and the potential energy
  at the step's end comes free.
- drift-kick-drift (DKD, the ordering of REBOUND's leapfrog): x += h/2 v; v += h a(x); x += h/2 v.
  Consecutive half-drifts merge; a step also costs `len(weights)` evaluations, but the forces it
  evaluates are at mid-drift positions, not at the step's end.

Both are second order with different error constants: KDK conserves the modified energy
H + h^2 (vHv / 12 - F^2 / 24) + O(h^4), DKD H - h^2 (vHv / 24 - F^2 / 12) + O(h^4) (F^2 = sum_i m_i |a_i|^2,
vHv the potential's Hessian applied twice to the velocities). At the pericentre of a Kepler orbit of
eccentricity e, vHv = (1 + e) F^2: KDK's term is (1 + 2e) F^2 / 24 and DKD's (1 - e) F^2 / 24, so on
eccentric orbits DKD's energy error swings much less (the benchmark measures which ordering wins where).

Names: `leapfrog`, `yoshida4` (Yoshida's 1990 triple jump, order 4, 3 substeps), `yoshida6` (Yoshida's
1990 order-6 "solution A", 7 substeps), each in KDK; the suffix `_dkd` selects the DKD ordering.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from dynaforge.errors import ConfigError

Ordering = Literal["kdk", "dkd"]


class Composition(NamedTuple):
    """A symmetric composition of leapfrog substeps."""

    name: str
    order: int
    """Global order of accuracy in the step size."""
    weights: tuple[float, ...]
    """Substep sizes as fractions of the step; they sum to one."""
    ordering: Ordering = "kdk"
    """The leapfrog substep: kick-drift-kick or drift-kick-drift (see the module docstring)."""

    @property
    def force_evaluations(self) -> int:
        """Force evaluations per step (KDK: first-same-as-last reuse included; DKD: one per substep)."""
        return len(self.weights)


def triple_jump(order: int) -> tuple[float, float]:
    """Yoshida's (1990) triple-jump weights (w1, w0): w1, w0, w1 raises a symmetric method of order
    `order` to order + 2. w1 = 1 / (2 - 2^(1/(order+1))), w0 = 1 - 2 w1 (negative: one substep goes back)."""
    root = 2.0 ** (1.0 / (order + 1))
    w1 = 1.0 / (2.0 - root)
    return w1, 1.0 - 2.0 * w1


_W1, _W0 = triple_jump(2)
# Yoshida (1990), Phys. Lett. A 150, 262, table 1, solution A of the sixth-order composition
# w3 w2 w1 w0 w1 w2 w3 (w0 = 1 - 2 (w1 + w2 + w3)); the tests measure its order.
_Y6 = (0.784513610477560, 0.235573213359357, -1.17767998417887)
_Y6_0 = 1.0 - 2.0 * sum(_Y6)

_BASE: dict[str, tuple[int, tuple[float, ...]]] = {
    "leapfrog": (2, (1.0,)),
    "yoshida4": (4, (_W1, _W0, _W1)),
    "yoshida6": (6, (*_Y6, _Y6_0, *reversed(_Y6))),
}

SCHEMES: dict[str, Composition] = {}
for _name, (_order, _weights) in _BASE.items():
    SCHEMES[_name] = Composition(_name, _order, _weights, "kdk")
    SCHEMES[f"{_name}_dkd"] = Composition(f"{_name}_dkd", _order, _weights, "dkd")

LEAPFROG = SCHEMES["leapfrog"]
LEAPFROG_DKD = SCHEMES["leapfrog_dkd"]
YOSHIDA4 = SCHEMES["yoshida4"]
YOSHIDA4_DKD = SCHEMES["yoshida4_dkd"]
YOSHIDA6 = SCHEMES["yoshida6"]
SCHEME_NAMES = tuple(SCHEMES)


def scheme_named(name: str | Composition) -> Composition:
    """The scheme called `name` (a `Composition` passes through); ConfigError naming the valid ones."""
    if isinstance(name, Composition):
        return name
    if name not in SCHEMES:
        raise ConfigError(
            f"unknown N-body integrator {name!r} (system.integrator); valid names: {', '.join(SCHEME_NAMES)}"
        )
    return SCHEMES[name]
