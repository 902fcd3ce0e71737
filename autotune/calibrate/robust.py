"""Robust nonlinear least squares with a prior: Levenberg-Marquardt on a soft-L1 loss.

Why our own and not ``scipy.optimize.least_squares(loss="soft_l1")``: scipy is not one of
autotune's dependencies, and the problem is small (a handful of log-constants, a few dozen
residuals), so a damped Gauss-Newton loop in numpy is short. Why a prior: some constants
move the probes' figures almost alike (a fixed step overhead and a slower weight read both
lengthen every decode step), and a weak Gaussian prior on the log of each constant, centred
on the base profile's value, keeps such a pair at its published split instead of letting
it run off along the ridge; the stated uncertainty of such a constant is then close to the
prior's width, which says honestly that the probes did not pin it down
(docs/calibrate.md#3-the-fit).

Pure: it calls the residual function it is given and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["RobustFit", "robust_fit"]

Vector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RobustFit:
    """The fitted parameters, their standard errors (from the posterior's curvature, the
    noise scale estimated from the residuals), the residuals at the solution, the objective
    there and the noise scale."""

    x: Vector
    stderr: Vector
    residuals: Vector
    cost: float
    noise: float


def _loss(u: Vector, c: float) -> float:
    """Half the soft-L1 loss of the scaled residuals: u^2 / 2 near 0, c |u| far out."""
    return float(np.sum(c**2 * (np.sqrt(1.0 + (u / c) ** 2) - 1.0)))


def _weights(u: Vector, c: float) -> Vector:
    """The loss's curvature weight per residual (IRLS): 1 near 0, c / |u| far out."""
    return 1.0 / np.sqrt(1.0 + (u / c) ** 2)


def robust_fit(
    residual: Callable[[Vector], Vector],
    x0: Vector,
    *,
    prior_mean: Vector,
    prior_sigma: Vector,
    noise: float = 0.05,
    f_scale: float = 3.0,
    noise_floor: float = 0.01,
    max_iter: int = 25,
    diff_step: float = 0.05,
    cov_step: float = 0.25,
    tol: float = 1e-4,
    time_limit_s: float | None = None,
    errors: bool = True,
    reserve_evals: int = 0,
) -> RobustFit:
    """Minimize ``sum(soft_l1(r / noise)) / 2 + sum(((x - mu) / prior_sigma)^2) / 2``.

    ``r`` is ``residual(x)``; ``noise`` is its expected scatter (the data's weight against
    the prior). ``soft_l1`` is ``2 c^2 (sqrt(1 + (u/c)^2) - 1)`` with ``c = f_scale``:
    quadratic for a residual within ``f_scale`` noise units, linear beyond, so one wild
    measurement pulls the fit much less than in plain least squares. The Jacobian is a
    forward difference of ``diff_step`` in each parameter (the residual function may be
    piecewise, e.g. a simulator's discrete steps, so the step is not tiny). Each iteration
    reweights (IRLS) and takes a damped Gauss-Newton step; no new iteration starts when
    it, the errors and ``reserve_evals`` more evaluations (a later call's errors) would not
    fit in ``time_limit_s`` of CPU at the evaluations' mean cost so far (the result is then
    the best point so far), so the whole fit stays within the limit, except that the first
    iteration always runs: where one iteration and the errors cost more than the limit, the
    fit takes that long. The errors' wide step (below) is left out once the limit is spent.

    The standard errors come from the posterior's curvature (a central difference of
    ``cov_step`` each way) with the noise re-estimated from the residuals at the solution,
    never below ``noise_floor``: a fit that matches its data exactly does not claim a
    certainty no measurement has. Each is at least what the objective's own rise along
    that parameter gives, on its flatter side, over 1 and 4 times ``cov_step``: a
    residual with a kink is steep on one side only. ``errors=False`` skips them (NaN), and
    the noise stays ``noise``: for a start among several, whose best is then given errors by
    a call from its ``x`` with ``max_iter=0``.
    """
    x = np.asarray(x0, dtype=float).copy()
    mu = np.asarray(prior_mean, dtype=float)
    prec = 1.0 / np.asarray(prior_sigma, dtype=float) ** 2

    evals = [0]

    def evaluate(v: Vector) -> tuple[Vector, float]:
        evals[0] += 1
        u = np.asarray(residual(v), dtype=float) / noise
        return u, _loss(u, f_scale) + 0.5 * float(np.sum(prec * (v - mu) ** 2))

    def jacobian(v: Vector, u: Vector) -> Vector:
        jac = np.empty((u.size, v.size))
        for j in range(v.size):
            vj = v.copy()
            vj[j] += diff_step
            jac[:, j] = (evaluate(vj)[0] - u) / diff_step
        return jac

    t0 = time.thread_time()
    u, cost = evaluate(x)
    lam = 1e-2
    # an iteration is a Jacobian and about two trial steps; the errors, four per parameter
    ahead = x.size + 2 + (4 * x.size if errors else 0) + reserve_evals
    for it in range(max_iter):
        spent = time.thread_time() - t0
        # the first iteration always runs: a fit that never moves from its start is no fit
        if it and time_limit_s is not None and spent + spent / evals[0] * ahead > time_limit_s:
            break
        jac = jacobian(x, u)
        w = _weights(u, f_scale)
        a = jac.T @ (w[:, None] * jac) + np.diag(prec)
        g = jac.T @ (w * u) + prec * (x - mu)
        drop = 0.0
        for _ in range(8):
            step = np.linalg.solve(a + lam * np.diag(np.diag(a)), -g)
            u_new, cost_new = evaluate(x + step)
            if cost_new < cost:
                drop = (cost - cost_new) / max(cost, 1e-12)
                x, u, cost = x + step, u_new, cost_new
                lam = max(lam / 3.0, 1e-6)
                break
            lam *= 4.0
        if drop < tol:
            break
    if not errors:  # a start of several: only the best one's errors are wanted
        return RobustFit(x, np.full(x.size, np.nan), u * noise, cost, noise)
    # The posterior: J'WJ / s^2 + prior precision, s^2 the residuals' weighted scatter. Its
    # Jacobian is a wide central difference: a narrow one on a piecewise residual reads a
    # step's jump as information the data do not hold (docs/calibrate.md#3-the-fit).
    jac = np.empty((u.size, x.size))
    w = _weights(u, f_scale)

    def quad(uv: Vector, v: Vector) -> float:
        """The objective with the loss's weights held at the solution: quadratic wherever
        the residuals are linear, so its curvature is J'WJ's (plus the prior's)."""
        return 0.5 * float(np.sum(w * uv**2) + np.sum(prec * (v - mu) ** 2))

    # Its curvature along each parameter from the rise on the flatter side,
    # 2 (Q(x +- h) - Q(x)) / h^2, the lesser over steps h of 1 and 4 times cov_step: the
    # same on both sides and at every width where the residuals are linear; where a figure
    # moves only once a queue forms (a kink), steep on one side only.
    # The wide step only while ``time_limit_s`` lasts: far from the solution the residual's
    # evaluations can cost several times the fit's own (a simulator given extreme constants),
    # and a caller's budget holds the errors too (docs/calibrate.md#3-the-fit).
    q0 = quad(u, x)
    rise = np.full(x.size, np.inf)
    for k, h in enumerate(cov_step * np.array([1.0, 4.0])):
        for j in range(x.size):
            if k and time_limit_s is not None and time.thread_time() - t0 > time_limit_s:
                break
            hi, lo = x.copy(), x.copy()
            hi[j] += h
            lo[j] -= h
            u_hi, u_lo = evaluate(hi)[0], evaluate(lo)[0]
            if k == 0:
                jac[:, j] = (u_hi - u_lo) / (2.0 * h)
            rise[j] = min(rise[j], 2.0 * (min(quad(u_hi, hi), quad(u_lo, lo)) - q0) / h**2)
    s2 = max(float(np.sum(w * u**2)) / max(1, u.size - x.size), (noise_floor / noise) ** 2)
    cov = np.linalg.inv(jac.T @ (w[:, None] * jac) / s2 + np.diag(prec))
    stderr = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    # J'WJ squares the slopes of a piecewise residual's jumps and reads a kink's steep side
    # for both; where Q rises less on one side, that curvature (conditional on the other
    # parameters) states the error instead (docs/calibrate.md#3-the-fit).
    data = np.clip(rise - prec, 0.0, None)
    stderr = np.maximum(stderr, 1.0 / np.sqrt(data / s2 + prec))
    return RobustFit(x, stderr, u * noise, cost, noise * float(np.sqrt(s2)))
