"""Initial conditions of N-body systems, the analytic Kepler orbit, and .npy files of initial conditions.

All functions here work in float64 numpy on one system at a time (positions and velocities (bodies, 3),
masses (bodies,)); `NBody.draw_samples` stacks them into a batch. Conventions: see `dynaforge.systems.nbody`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dynaforge.atomic import atomic_path
from dynaforge.config import NBodyConfig
from dynaforge.errors import ConfigError
from dynaforge.systems.pde.initial import draw_from_range

FIGURE_EIGHT_PERIOD = 6.32591398
"""Period of the figure-eight choreography with unit masses and G = 1 (Simó 2002)."""


class InitialBodies(NamedTuple):
    positions: np.ndarray  # (bodies, 3)
    velocities: np.ndarray  # (bodies, 3)
    masses: np.ndarray  # (bodies,)


# --------------------------------------------------------------------------------------------------
# Kepler orbits


def solve_kepler(mean_anomaly: np.ndarray | float, eccentricity: float, tol: float = 1e-15) -> np.ndarray:
    """Eccentric anomaly E with E - e sin E = M (Newton's method from E = pi, which converges for all e < 1)."""
    m = np.remainder(np.asarray(mean_anomaly, dtype=np.float64), 2.0 * math.pi)
    e_anomaly = np.full_like(m, math.pi)
    for _ in range(100):
        step = (e_anomaly - eccentricity * np.sin(e_anomaly) - m) / (1.0 - eccentricity * np.cos(e_anomaly))
        e_anomaly = e_anomaly - step
        if np.max(np.abs(step)) < tol:
            break
    return np.asarray(e_anomaly)


def kepler_relative_state(
    semi_major_axis: float, eccentricity: float, total_mass: float, eccentric_anomaly: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """Relative position x2 - x1 and velocity (..., 3) on the orbit at eccentric anomaly E (pericentre on +x).

    r = a (cos E - e, sqrt(1 - e^2) sin E), v = sqrt(M a) / r_len (-sin E, sqrt(1 - e^2) cos E).
    """
    a, e = semi_major_axis, eccentricity
    big_e = np.asarray(eccentric_anomaly, dtype=np.float64)
    root = math.sqrt(1.0 - e * e)
    radius = a * (1.0 - e * np.cos(big_e))
    zeros = np.zeros_like(big_e)
    position = np.stack([a * (np.cos(big_e) - e), a * root * np.sin(big_e), zeros], axis=-1)
    speed = math.sqrt(total_mass * a) / radius
    velocity = np.stack([-speed * np.sin(big_e), speed * root * np.cos(big_e), zeros], axis=-1)
    return position, velocity


def kepler_orbit(
    semi_major_axis: float, eccentricity: float, m1: float, m2: float, mean_anomaly: float = 0.0
) -> InitialBodies:
    """Two bodies on a Kepler orbit, centre of mass at rest at the origin, orbit in the xy plane."""
    total = m1 + m2
    big_e = solve_kepler(mean_anomaly, eccentricity)
    rel_x, rel_v = kepler_relative_state(semi_major_axis, eccentricity, total, big_e)
    positions = np.stack([-m2 / total * rel_x, m1 / total * rel_x])
    velocities = np.stack([-m2 / total * rel_v, m1 / total * rel_v])
    return InitialBodies(positions, velocities, np.asarray([m1, m2], dtype=np.float64))


def kepler_analytic(
    semi_major_axis: float,
    eccentricity: float,
    m1: float,
    m2: float,
    times: np.ndarray,
    mean_anomaly: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact relative position and velocity (T, 3) at `times` for the orbit of `kepler_orbit`."""
    total = m1 + m2
    mean_motion = math.sqrt(total / semi_major_axis**3)
    big_e = solve_kepler(mean_anomaly + mean_motion * np.asarray(times, dtype=np.float64), eccentricity)
    return kepler_relative_state(semi_major_axis, eccentricity, total, big_e)


def orbital_elements(
    relative_position: np.ndarray, relative_velocity: np.ndarray, total_mass: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Semi-major axis and eccentricity (...,) of relative two-body states (..., 3) (G = 1); `total_mass`
    is a number or an array broadcastable to (...,)."""
    mass = np.asarray(total_mass, dtype=np.float64)
    r = np.linalg.norm(relative_position, axis=-1)
    v2 = (relative_velocity**2).sum(-1)
    specific_energy = 0.5 * v2 - mass / r
    a = -mass / (2.0 * specific_energy)
    h = np.cross(relative_position, relative_velocity)
    e_vector = np.cross(relative_velocity, h) / mass[..., None] - relative_position / r[..., None]
    return np.asarray(a), np.asarray(np.linalg.norm(e_vector, axis=-1))


# --------------------------------------------------------------------------------------------------
# Three bodies and clusters


def figure_eight() -> InitialBodies:
    """The figure-eight choreography of three unit masses (Chenciner & Montgomery 2000; Simó's values)."""
    x1 = np.asarray([0.97000436, -0.24308753, 0.0])
    v3 = np.asarray([-0.93240737, -0.86473146, 0.0])
    positions = np.stack([x1, -x1, np.zeros(3)])
    velocities = np.stack([-v3 / 2, -v3 / 2, v3])
    return InitialBodies(positions, velocities, np.ones(3, dtype=np.float64))


def plummer_sphere(bodies: int, rng: np.random.Generator, softening: float = 0.0) -> InitialBodies:
    """A Plummer sphere (Aarseth, Hénon & Wielen 1974) of equal masses, in virial equilibrium.

    Radii from the inverse cumulative mass profile r = (X^(-2/3) - 1)^(-1/2) (X < 0.999 to drop the far
    tail), isotropic directions, speeds q v_esc with q drawn from q^2 (1 - q^2)^(7/2) by rejection.
    Then `to_nbody_units` with virial ratio 1/2.
    """
    x = rng.uniform(0.0, 0.999, size=bodies)
    radius = 1.0 / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    positions = radius[:, None] * isotropic_directions(bodies, rng)
    q = np.empty(bodies)
    for i in range(bodies):
        while True:
            candidate, height = rng.uniform(0.0, 1.0), rng.uniform(0.0, 0.1)
            if height < candidate**2 * (1.0 - candidate**2) ** 3.5:
                q[i] = candidate
                break
    speed = q * math.sqrt(2.0) * (1.0 + radius**2) ** -0.25
    velocities = speed[:, None] * isotropic_directions(bodies, rng)
    masses = np.full(bodies, 1.0 / bodies)
    return to_nbody_units(InitialBodies(positions, velocities, masses), 0.5, softening)


def random_cluster(
    bodies: int,
    rng: np.random.Generator,
    mass_low: float = 1.0,
    mass_high: float = 1.0,
    virial_ratio: float = 0.5,
    softening: float = 0.0,
) -> InitialBodies:
    """Uniform positions in the unit ball, isotropic Gaussian velocities, masses U(low, high), N-body units."""
    radius = rng.uniform(0.0, 1.0, size=bodies) ** (1.0 / 3.0)
    positions = radius[:, None] * isotropic_directions(bodies, rng)
    velocities = rng.standard_normal((bodies, 3))
    masses = rng.uniform(mass_low, mass_high, size=bodies) if mass_high > mass_low else np.ones(bodies)
    return to_nbody_units(InitialBodies(positions, velocities, masses), virial_ratio, softening)


def isotropic_directions(n: int, rng: np.random.Generator) -> np.ndarray:
    cos_theta = rng.uniform(-1.0, 1.0, size=n)
    phi = rng.uniform(0.0, 2.0 * math.pi, size=n)
    sin_theta = np.sqrt(1.0 - cos_theta**2)
    return np.stack([sin_theta * np.cos(phi), sin_theta * np.sin(phi), cos_theta], axis=1)


def to_nbody_units(bodies: InitialBodies, virial_ratio: float, softening: float = 0.0) -> InitialBodies:
    """Total mass 1, centre of mass at rest at the origin, W = -1/2 unsoftened (virial radius 1), and
    K = virial_ratio * |sum_i x_i . F_i| with the softened forces (so 0.5 is virial equilibrium)."""
    masses = bodies.masses / bodies.masses.sum()
    positions = remove_centre(bodies.positions, masses)
    velocities = remove_centre(bodies.velocities, masses)
    positions = positions * (-2.0 * pair_potential(positions, masses, 0.0))  # W scales as 1/length
    kinetic = 0.5 * (masses * (velocities**2).sum(1)).sum()
    target = virial_ratio * abs(virial(positions, masses, softening))
    velocities = velocities * math.sqrt(target / kinetic) if kinetic > 0 else velocities
    return InitialBodies(positions, velocities, masses)


def remove_centre(vectors: np.ndarray, masses: np.ndarray) -> np.ndarray:
    return vectors - (masses[:, None] * vectors).sum(0) / masses.sum()


def pair_potential(positions: np.ndarray, masses: np.ndarray, softening: float) -> float:
    """W = -sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)."""
    i, j = np.triu_indices(len(masses), k=1)
    r2 = ((positions[i] - positions[j]) ** 2).sum(1) + softening**2
    return float(-(masses[i] * masses[j] / np.sqrt(r2)).sum())


def virial(positions: np.ndarray, masses: np.ndarray, softening: float) -> float:
    """sum_i x_i . F_i = -sum_{i<j} m_i m_j r_ij^2 / (r_ij^2 + eps^2)^(3/2) (equals W when eps = 0)."""
    i, j = np.triu_indices(len(masses), k=1)
    d2 = ((positions[i] - positions[j]) ** 2).sum(1)
    return float(-(masses[i] * masses[j] * d2 / (d2 + softening**2) ** 1.5).sum())


# --------------------------------------------------------------------------------------------------
# Drawing one system of a config (parameters row and initial state)


def draw_system(config: NBodyConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One system: parameter row in `config.parameter_names()` order, positions and velocities (bodies, 3).

    Draw order (fixed, so a sample depends on its generator alone): softening, external mass, then the
    family's own draws.
    """
    softening = draw_from_range(config.softening, rng)
    external_mass = draw_from_range(config.external_mass, rng)
    family = config.initial
    extra: list[float] = []
    if family.family == "kepler":
        a = draw_from_range(family.semi_major_axis, rng)
        e = draw_from_range(family.eccentricity, rng)
        phase = draw_from_range(family.mean_anomaly, rng)
        m1, m2 = draw_from_range(family.mass, rng), draw_from_range(family.mass, rng)
        bodies = kepler_orbit(a, e, m1, m2, phase)
        extra = [a, e]
    elif family.family == "figure_eight":
        bodies = figure_eight()
    elif family.family == "plummer":
        bodies = plummer_sphere(config.bodies, rng, softening)
    else:
        bodies = random_cluster(
            config.bodies, rng, family.mass.low, family.mass.high, family.virial_ratio, softening
        )
    row = [*bodies.masses, softening, external_mass, *config.external_position, *extra]
    return np.asarray(row, dtype=np.float64), bodies.positions, bodies.velocities


# --------------------------------------------------------------------------------------------------
# .npy files


def save_initial_npy(
    path: str | Path, positions: np.ndarray, velocities: np.ndarray, params: np.ndarray
) -> None:
    """Save a batch of initial conditions as one .npy array (batch, bodies, 7 + P), written atomically.

    Per body: x, y, z, vx, vy, vz, then the system's P parameter values (repeated on every body), so one
    plain array round-trips a batch. `load_initial_npy` splits it again.
    """
    positions, velocities, params = (np.asarray(a, dtype=np.float64) for a in (positions, velocities, params))
    if positions.ndim != 3 or positions.shape != velocities.shape or positions.shape[-1] != 3:
        raise ConfigError(
            f"positions and velocities must both be (batch, bodies, 3), got {positions.shape} and {velocities.shape}"
        )
    if params.ndim != 2 or params.shape[0] != positions.shape[0]:
        raise ConfigError(f"params must be (batch, P) with batch {positions.shape[0]}, got {params.shape}")
    repeated = np.broadcast_to(params[:, None, :], (*positions.shape[:2], params.shape[1]))
    array = np.concatenate([positions, velocities, repeated], axis=-1)
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def load_initial_npy(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions (batch, bodies, 3), velocities and params (batch, P) from `save_initial_npy`'s format."""
    array = np.load(Path(path), allow_pickle=False)
    if array.ndim != 3 or array.shape[-1] < 6:
        raise ConfigError(
            f"{path}: expected an array (batch, bodies, 6 + P) written by save_initial_npy, got {array.shape}"
        )
    return array[..., :3].copy(), array[..., 3:6].copy(), array[:, 0, 6:].copy()
