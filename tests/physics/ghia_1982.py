"""Published centre-line velocities of the lid-driven cavity: Ghia, Ghia & Shin, "High-Re solutions for
incompressible flow using the Navier-Stokes equations and a multigrid method", J. Comput. Phys. 48 (1982)
387-411, Table I (u along the vertical line through the cavity's centre) and Table II (v along the
horizontal line), for Re = 100 and 1,000, on their 129 x 129 grid (lid speed 1, side 1).

The tables give the grid-point number k (1 .. 129) of each value; its position is (k - 1) / 128 (the tables
print it rounded to four decimals)."""

from __future__ import annotations

import numpy as np

U_POINTS = np.array([129, 126, 125, 124, 123, 110, 95, 80, 65, 59, 37, 23, 14, 10, 9, 8, 1])
"""Table I: grid points along the vertical centre line, top to bottom."""
V_POINTS = np.array([129, 125, 124, 123, 122, 117, 111, 104, 65, 31, 30, 21, 13, 11, 10, 9, 1])
"""Table II: grid points along the horizontal centre line, right to left."""

Y = (U_POINTS - 1) / 128.0
X = (V_POINTS - 1) / 128.0

U = {
    100: np.array([1.00000, 0.84123, 0.78871, 0.73722, 0.68717, 0.23151, 0.00332, -0.13641, -0.20581,
                   -0.21090, -0.15662, -0.10150, -0.06434, -0.04775, -0.04192, -0.03717, 0.00000]),
    1000: np.array([1.00000, 0.65928, 0.57492, 0.51117, 0.46604, 0.33304, 0.18719, 0.05702, -0.06080,
                    -0.10648, -0.27805, -0.38289, -0.29730, -0.22220, -0.20196, -0.18109, 0.00000]),
}  # fmt: skip
"""Table I: u at (1/2, Y)."""

V = {
    100: np.array([0.00000, -0.05906, -0.07391, -0.08864, -0.10313, -0.16914, -0.22445, -0.24533, 0.05454,
                   0.17527, 0.17507, 0.16077, 0.12317, 0.10890, 0.10091, 0.09233, 0.00000]),
    1000: np.array([0.00000, -0.21388, -0.27669, -0.33714, -0.39188, -0.51550, -0.42665, -0.31966, 0.02526,
                    0.32235, 0.33075, 0.37095, 0.32627, 0.30353, 0.29012, 0.27485, 0.00000]),
}  # fmt: skip
"""Table II: v at (X, 1/2)."""
