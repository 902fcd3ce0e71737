"""A small slo-capacity study on real vLLM (CPU), and whether its capacities survive
re-measurement with vLLM's own client.

1. Builds the ``tuning`` size of the test model (tests/real_vllm/make_tiny_model.py, whose
   step time grows with the batch: docs/vllm-cpu.md#8-a-model-whose-step-time-grows-with-the-batch)
   and runs a slo-capacity study with ``worker.kind: vllm`` (the venv's real ``vllm serve``)
   and its validation phase on, into a SQLite file.
2. Re-measures the baseline and the recommendation (the best candidate when the verdict keeps
   the baseline or cannot tell) with ``vllm bench serve`` from the same venv, each server
   launched with the trial's stored argv (only the port changed): the study's lengths
   (``--dataset-name random``, fixed lengths, ``--ignore-eos``), Poisson arrivals at
   ``--request-rate``, enough prompts to last the study's minimum level length. Rates: the
   capacity the study reported for the config (its validated capacity when validation ran)
   and one lattice step above. Runs are interleaved: each round launches every config once
   (in turn) and runs both rates on it. A run *held* when its p99 TTFT and p99 TPOT are
   within the SLOs and no request failed.

A claim is reproduced when the claimed rate held in a majority of the runs and the rate one
step above failed in a majority (a capacity at the top of the range claims only that it
held there; one below the range only that the lowest load failed). The host's load average
is printed before, during (sampled every 5 s: mean and highest) and after: the machine may be
shared, and a loaded host moves every figure. Ends with one JSON line.

Usage: python benchmarks/real_study.py [--quick] [--venv PATH] [--workdir DIR]
``--quick``: the baseline alone (so no validation), shorter levels, a coarser lattice, one run
per rate (the real-vLLM test group runs it: tests/real_vllm/test_real_study_bench.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotune.config import StudyConfig, parse_config
from autotune.errors import ClientLimitError
from autotune.report.bounds import AT_TOP, BELOW_LOW, Capacity, trial_capacity
from autotune.report.recommend import recommend
from autotune.store import Store, TrialRecord
from autotune.tuning.measure.capacity import Lattice
from autotune.tuning.measure.level_plan import lattice_of
from autotune.tuning.run.controller import run_study
from autotune.tuning.run.create import create_study
from autotune.tuning.study_attrs import read_noise
from autotune.workers.env import worker_environment
from autotune.workers.vllm import DEFAULT_ENV

ROOT = Path(__file__).resolve().parents[1]

SERVED = "autotune/tiny-llama-tuning"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
INPUT_LEN, OUTPUT_LEN = 128, 32
RATE = 4.0  # requests/s at load scale 1.0
SLO = {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 100.0}
KV_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class Plan:
    """What --quick changes."""

    n_trials: int
    repeats: int  # validation runs per config
    runs: int  # vllm bench serve runs per config and rate
    min_level_s: float
    min_level_requests: int
    resolution: float


# full: the baseline, 2 searched configs, 2 validation runs each for the baseline and the top
# candidate, 3 bench rounds: 13 server launches (about 20 s each on an idle 2-core host).
# Levels of 30 s, the product's default (docs/tuning.md#13-level-length), and 100 requests
# rather than 200: at the lattice's bottom (1 req/s) 200 would be a 200-s level.
FULL = Plan(
    n_trials=3, repeats=2, runs=3, min_level_s=30.0, min_level_requests=100, resolution=0.25
)
# quick (CI's real-vLLM group, about 2 minutes on an idle host): the baseline alone, with the
# server's noise record, re-measured once per rate: 2 launches. No candidate, so no validation.
QUICK = Plan(n_trials=1, repeats=1, runs=1, min_level_s=5.0, min_level_requests=12, resolution=1.0)


def study_dict(name: str, venv: Path, model: Path, workdir: Path, plan: Plan) -> dict[str, Any]:
    strategy: dict[str, Any] = {
        "name": "joint",
        "n_trials": plan.n_trials,
        "capacity_low": 0.25,
        # up to 12 req/s: on 2 cores the client shares the CPU with the server, and far past
        # the server's capacity it reads its streams in bursts and the level is client-limited
        # (docs/loadgen.md#5-client-limited-levels); the tuning model holds about 2-8 req/s here
        "capacity_high": 3.0,
        "capacity_resolution": plan.resolution,
        "validate": {"enabled": plan.n_trials > 1, "top_k": 1, "repeats": plan.repeats},
        # docs/tuning.md#13-level-length
        "min_level_s": plan.min_level_s,
        "min_level_requests": plan.min_level_requests,
    }
    return {
        "name": name,
        "model": {"name": str(model), "served_name": SERVED},
        "hardware": "test-4GB",
        "worker": {
            "kind": "vllm",
            "vllm_executable": [str(venv / "bin" / "vllm")],
            "static_args": {"enforce_eager": True, "kv_cache_memory_bytes": KV_BYTES},
            "env": dict(ENV),
            "startup_timeout_s": 300,
            "workdir": str(workdir),
        },
        "workload": {
            "source": "synthetic",
            "num_prompts": plan.min_level_requests,
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "input_sigma": 0.0,  # fixed lengths, as vllm bench serve's random dataset sends
            "output_sigma": 0.0,
            "arrival": "poisson",
            "rate": RATE,
            "seed": 0,
        },
        "slo": dict(SLO),
        "mode": "slo-capacity",
        "search": {
            "max_model_len": {"candidates": [1024]},
            "max_num_seqs": {"low": 2, "high": 64},
            "max_num_batched_tokens": {"low": 256, "high": 4096},
        },
        "strategy": strategy,
        "seed": 0,
    }


# -- the venv, the model and a launched server -------------------------------------------


def find_venv(given: str | None) -> Path:
    if given:
        return Path(given)
    env = os.environ.get("AUTOTUNE_VLLM_VENV")
    if env and (Path(env) / "bin" / "vllm").is_file():
        return Path(env)
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm_cpu_env.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def build_model(venv: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            str(ROOT / "tests/real_vllm/make_tiny_model.py"),
            *(str(out), "--size", "tuning"),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **ENV, "HF_HOME": str(out.parent / "hf")},
    )
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return info


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def with_port(argv: list[str], port: int) -> list[str]:
    """The stored launch argv with only ``--port`` changed (the study's port is gone)."""
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


class Server:
    """One ``vllm serve`` from a trial's stored argv, in its own process group, with the
    environment autotune's worker gives a trial (docs/vllm-cpu.md#4-serving)."""

    def __init__(self, argv: list[str], cfg: StudyConfig, workdir: Path) -> None:
        self.port = free_port()
        self.argv = with_port(argv, self.port)
        self.tmp = tmp = Path(tempfile.mkdtemp(prefix="atb-"))  # short: ZMQ sockets live here
        env = worker_environment(os.environ, passthrough=cfg.worker.env_passthrough)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        env.update({**DEFAULT_ENV, **cfg.worker.env, "TMPDIR": str(tmp)})
        env.update(VLLM_CACHE_ROOT=str(workdir / "vc"), TORCHINDUCTOR_CACHE_DIR=str(workdir / "ti"))
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = (workdir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            self.argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}: see {workdir}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer /health in 300 s: see {workdir}")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # the engine's processes share the group and may outlive the API server briefly
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- vllm bench serve --------------------------------------------------------------------


@dataclass
class BenchRun:
    round: int
    rate_rps: float
    p99_ttft_ms: float
    p99_tpot_ms: float
    failed: int
    completed: int
    output_tok_s: float
    load1: float  # the host's 1-minute load average at the run's start
    held: bool = False


def bench(
    venv: Path, server: Server, model: Path, cfg: StudyConfig, rate: float, n: int, out: Path
) -> dict[str, Any]:
    argv = [
        str(venv / "bin" / "vllm"),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        server.url,
        "--model",
        SERVED,
        "--tokenizer",
        str(model),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(cfg.workload.input_len),
        "--random-output-len",
        str(cfg.workload.output_len),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--request-rate",
        f"{rate:.6g}",
        "--num-prompts",
        str(n),
        "--seed",
        str(len(list(out.parent.iterdir()))),  # a fresh sample per run
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "99",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
    ]
    env = {**os.environ, **ENV, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def prompts_for(cfg: StudyConfig, rate: float) -> int:
    """Enough prompts to last the study's minimum level length at ``rate``."""
    st = cfg.strategy
    min_s, min_n = st.min_level_s, st.min_level_requests
    return max(min_n, int(rate * min_s + 0.999), cfg.workload.num_prompts)


# -- the claims --------------------------------------------------------------------------


@dataclass
class Claim:
    label: str  # "baseline" or "recommended" / "best candidate"
    trial: int
    engine_args: dict[str, Any]
    capacity: Capacity
    source: str  # "validated" or "study"
    at: float = 0.0  # the claimed rate, req/s
    above: float = 0.0  # one lattice step above, req/s
    runs_at: list[BenchRun] = field(default_factory=list)
    runs_above: list[BenchRun] = field(default_factory=list)

    @property
    def held_at(self) -> int:
        return sum(r.held for r in self.runs_at)

    @property
    def failed_above(self) -> int:
        return sum(not r.held for r in self.runs_above)

    @property
    def reproduced(self) -> bool:
        at_ok = 2 * self.held_at > len(self.runs_at)
        above_ok = 2 * self.failed_above > len(self.runs_above)
        if self.capacity.status == AT_TOP:  # "at least the top": nothing claimed above it
            return at_ok
        if self.capacity.status == BELOW_LOW:  # "below the lowest load": it fails there
            return 2 * (len(self.runs_at) - self.held_at) > len(self.runs_at)
        return at_ok and above_ok


def claimed(
    cfg: StudyConfig, rec: Any, t: TrialRecord, label: str, lattice: Lattice
) -> Claim | None:
    fig = next((f for f in rec.figures if f.trial == t.optuna_trial_number), None)
    cap, source = (fig.capacity, "validated") if fig and fig.capacity else (None, "study")
    if cap is None:
        cap = trial_capacity(t, lattice, cfg.mode)
    if cap is None or cap.scale is None or cfg.workload.rate is None:
        return None
    k = lattice.index(cap.scale)
    step = lattice.scale(k + 1) if k < lattice.top else cap.scale * (1 + lattice.resolution)
    c = Claim(label, t.optuna_trial_number, dict(t.engine_args), cap, source)
    c.at, c.above = cap.scale * cfg.workload.rate, step * cfg.workload.rate
    return c


def pick(cfg: StudyConfig, rec: Any, trials: list[TrialRecord]) -> list[tuple[str, TrialRecord]]:
    """The baseline, and the recommendation (or, when the verdict picks no candidate, the
    candidate the validation ranked first; without validation the study's best)."""
    by_n = {t.optuna_trial_number: t for t in trials}
    out: list[tuple[str, TrialRecord]] = []
    if rec.baseline is not None:
        out.append(("baseline", rec.baseline))
    v = rec.validation
    if v is not None and v.chosen is not None and v.chosen in by_n:
        out.append(("recommended", by_n[v.chosen]))
    elif v is not None and v.best is not None and v.best in by_n:
        out.append(("best candidate", by_n[v.best]))
    elif rec.trial is not rec.baseline:
        out.append(("recommended", rec.trial))
    return out


def load1() -> float:
    return os.getloadavg()[0]


class LoadWatch:
    """The host's 1-minute load average, sampled every 5 s while the study and the
    re-measurement run (the machine may be shared: a loaded host moves every figure)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(load1())
            self._stop.wait(5.0)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        xs = self.samples or [load1()]
        return {"during_mean": sum(xs) / len(xs), "during_max": max(xs)}


def workspace(
    venv_arg: str | None, workdir: Path | None, prefix: str
) -> tuple[Path, Path, Path, dict[str, Any]]:
    """The venv, the work folder (``workdir`` or a new temporary one), and the tuning-size
    model built in it with what ``make_tiny_model.py`` says of it."""
    venv = find_venv(venv_arg)
    work = workdir or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    return venv, work, model, build_model(venv, model)


def quiet() -> None:
    """For a run of half an hour or more: each line out as it is printed, so a run cut short
    by a timeout keeps what it measured; the libraries' warnings and logs off."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.WARNING)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the real-vLLM test group's variant")
    ap.add_argument("--venv", help="the vllm-cpu venv (default: scripts/vllm_cpu_env.sh)")
    ap.add_argument("--workdir", type=Path, help="keep the model, study.db and logs here")
    a = ap.parse_args()
    quiet()
    plan = QUICK if a.quick else FULL
    venv, work, model, info = workspace(a.venv, a.workdir, "rs-")
    loads = {"before": load1()}
    watch = LoadWatch()
    t_all = time.perf_counter()
    d = study_dict("real-study", venv, model, work / "workers", plan)
    text = yaml.safe_dump(d)
    (work / "study.yaml").write_text(text)
    cfg = parse_config(text, str(work / "study.yaml"))
    t0 = time.perf_counter()
    store = Store.open(f"sqlite:///{work}/study.db")
    create_study(cfg, text, store)
    try:
        run_study(cfg.name, store)
    except ClientLimitError as exc:
        # the study stopped: this host could not drive the load
        # (docs/loadgen.md#5-client-limited-levels), so there is no claim to re-measure; say so
        # in the JSON line too
        store.close()
        loads.update(watch.stop())
        loads["after"] = load1()
        print(f"client-limited: {exc}")
        print(
            json.dumps(
                {"bench": "real_study", "quick": a.quick, "client_limited": str(exc)}
                | {"study_wall_s": round(time.perf_counter() - t0, 1)}
                | {"load_avg": {k: round(x, 2) for k, x in loads.items()}}
            )
        )
        raise SystemExit(3) from None
    study_wall = time.perf_counter() - t0
    trials = store.trials(cfg.name)
    repeats = store.repeats(cfg.name)
    ostudy = optuna.load_study(study_name=cfg.name, storage=store.optuna_storage())
    noise = read_noise(ostudy)
    store.close()
    rec = recommend(cfg, trials, repeats, noise)
    if rec is None:
        raise SystemExit("the study found no feasible config: nothing to re-measure")
    lattice = lattice_of(cfg)
    claims = [c for lab, t in pick(cfg, rec, trials) if (c := claimed(cfg, rec, t, lab, lattice))]
    argv = {t.optuna_trial_number: t.launch_argv for t in trials}
    for rnd in range(plan.runs):
        order = claims[rnd % len(claims) :] + claims[: rnd % len(claims)]  # rotated per round
        for c in order:
            run_dir = work / "bench" / f"r{rnd}-t{c.trial}"
            stored = argv[c.trial]
            assert stored is not None, f"trial {c.trial} stored no launch argv"
            server = Server(stored, cfg, run_dir)
            try:
                rates = [(c.at, c.runs_at), (c.above, c.runs_above)]
                for rate, into in rates if rnd % 2 == 0 else rates[::-1]:
                    lo = load1()
                    out = run_dir / f"rate-{rate:.4g}.json"
                    res = bench(venv, server, model, cfg, rate, prompts_for(cfg, rate), out)
                    run = BenchRun(
                        rnd,
                        rate,
                        float(res["p99_ttft_ms"]),
                        float(res["p99_tpot_ms"]),
                        int(res.get("failed", 0)),
                        int(res["completed"]),
                        float(res["output_throughput"]),
                        lo,
                    )
                    run.held = (
                        run.failed == 0
                        and run.p99_ttft_ms <= (cfg.slo.p99_ttft_ms or float("inf"))
                        and run.p99_tpot_ms <= (cfg.slo.p99_tpot_ms or float("inf"))
                    )
                    into.append(run)
            finally:
                server.stop()
    loads.update(watch.stop())
    loads["after"] = load1()
    v = rec.validation
    verdict = v.verdict if v is not None else None
    print(
        f"model: {info['params']:,} parameters, hidden {info['hidden_size']}, "
        f"{info['layers']} layers; study {study_wall:.0f} s, {len(trials)} trials, "
        f"verdict {verdict}"
    )
    print(
        f"load average (1 min): before {loads['before']:.2f}, during {loads['during_mean']:.2f}"
        f" (up to {loads['during_max']:.2f}), after {loads['after']:.2f} ({os.cpu_count()} CPUs)"
    )
    print(
        "config            | trial | claimed req/s           | held at it | above req/s "
        "| failed above | reproduced"
    )
    for c in claims:
        bound = c.capacity.bound
        print(
            f"{c.label:17s} | {c.trial:5d} | {bound}{c.at:7.2f} ({c.source:9s}) | "
            f"{c.held_at}/{len(c.runs_at):<8d} | {c.above:11.2f} | "
            f"{c.failed_above}/{len(c.runs_above):<10d} | {c.reproduced}"
        )
        for r in c.runs_at + c.runs_above:
            print(
                f"    round {r.round} at {r.rate_rps:6.2f} req/s: p99 TTFT {r.p99_ttft_ms:8.1f} "
                f"ms, p99 TPOT {r.p99_tpot_ms:6.1f} ms, failed {r.failed}, "
                f"{r.output_tok_s:7.1f} out tok/s, load {r.load1:.2f} -> "
                f"{'held' if r.held else 'failed'}"
            )
    share = sum(c.reproduced for c in claims) / len(claims) if claims else None
    print(
        json.dumps(
            {
                "bench": "real_study",
                "quick": a.quick,
                "claims_reproduced": round(share, 3) if share is not None else None,
                "noise_band_pct": round(noise.band_pct, 2) if noise is not None else None,
                "verdict": verdict,
                "study_wall_s": round(study_wall, 1),
                "total_wall_s": round(time.perf_counter() - t_all, 1),
                "slo": SLO,
                "load_avg": {k: round(x, 2) for k, x in loads.items()},
                "claims": [
                    {
                        "label": c.label,
                        "trial": c.trial,
                        "engine_args": c.engine_args,
                        "claimed_rps": round(c.at, 4),
                        "status": c.capacity.status,
                        "source": c.source,
                        "above_rps": round(c.above, 4),
                        "held_at": c.held_at,
                        "failed_above": c.failed_above,
                        "reproduced": c.reproduced,
                        "runs_at": [asdict(r) for r in c.runs_at],
                        "runs_above": [asdict(r) for r in c.runs_above],
                    }
                    for c in claims
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
