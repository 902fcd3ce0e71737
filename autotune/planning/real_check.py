"""The replicated check on the real worker (docs/sizing.md#9-on-real-workers).

With ``autotune size --worker vllm`` a row's config and capacity were measured on this host,
and its check should be too. The replicas behind a round-robin balancer are independent
servers, each at its share of the target on its own sample, so one real replica at that
share is what each of them sees: :class:`RealReplica` starts the candidate's config once and
runs one level per replica count the check asks for (``n``, then ``n - 1``, or a raised
count), each at the count's largest share. The deployment's latencies are that replica's;
its output tok/s is ``n`` times the replica's. What the worker cost (its launch to its exit,
on the host's clock, docs/cost.md) is added to the row's GPU-seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType

from autotune.planning.candidate_study import CandidateResult
from autotune.planning.deployment import ReplicaSetup, judged, replica_sample, replica_seed
from autotune.planning.replicas import DeploymentRun, DeploymentRunner, Target, split_load
from autotune.profiles.models import ModelProfile
from autotune.tuning.measure.runner_factory import make_runner

__all__ = ["RealReplica"]


class RealReplica:
    """One real replica of candidate ``c``'s best config, started on entry and stopped on
    exit; :meth:`runner` is the check's :class:`DeploymentRunner` on it, and :attr:`gpu_s`
    what the worker cost once it has stopped."""

    def __init__(
        self, c: CandidateResult, model: ModelProfile, setup: ReplicaSetup, workdir: Path
    ) -> None:
        self._c = c
        self._setup = setup
        self._runner = make_runner(c.config, model, setup.hardware, workdir)
        self._loop = asyncio.new_event_loop()
        self.gpu_s = 0.0

    def __enter__(self) -> RealReplica:
        try:
            self._loop.run_until_complete(
                self._runner.start(dict(self._c.engine_args or {}), "size-check")
            )
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    def _close(self) -> None:
        try:
            self._loop.run_until_complete(self._runner.stop())
        finally:
            self._loop.close()
        usage = self._runner.usage()
        self.gpu_s = usage.gpu_s if usage is not None else 0.0

    def runner(self, target: Target) -> DeploymentRunner:
        """Each count ``n``: one level at the largest of its ``n`` shares of ``target``."""
        setup = self._setup

        def run(n: int) -> DeploymentRun:
            share = max(split_load(target, n))
            wl = replica_sample(setup, target.kind, share, replica_seed(setup, n))
            out = self._loop.run_until_complete(self._runner.run_level(wl, 1.0))
            return judged(n, out.metrics, setup, copies=n)

        return run
