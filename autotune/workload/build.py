"""Build the workload a study config (or ``autotune bench``'s flags) describes."""

from __future__ import annotations

from dataclasses import replace

from autotune.config import WorkloadConfig
from autotune.errors import ConfigError
from autotune.workload import arrivals
from autotune.workload.core import Workload
from autotune.workload.sources import (
    LogNormal,
    load_sharegpt,
    random_workload,
    sharegpt_like_workload,
    synthetic_workload,
)
from autotune.workload.traces import load_azure, load_mooncake, load_trace

__all__ = ["build_workload", "prepare_prompts", "scale_rate"]

_TRACES = ("mooncake", "azure", "trace")


def _requests(cfg: WorkloadConfig, vocab_size: int) -> Workload:
    n, seed = cfg.num_prompts, cfg.seed
    if cfg.source == "synthetic":
        return synthetic_workload(n, LogNormal(cfg.input_len, cfg.input_sigma),
                                  LogNormal(cfg.output_len, cfg.output_sigma), seed=seed)
    if cfg.source == "sharegpt-like":
        return sharegpt_like_workload(n, seed=seed)
    if cfg.source == "random":
        return random_workload(n, input_len=cfg.input_len, output_len=cfg.output_len,
                               range_ratio=cfg.range_ratio, seed=seed, vocab_size=vocab_size)
    assert cfg.path is not None  # the config validator demands it for file sources
    if cfg.source == "sharegpt":
        return load_sharegpt(cfg.path, n, seed=seed)
    kw = {"time_scale": cfg.time_scale, "rate_scale": cfg.rate_scale, "max_requests": n,
          "vocab_size": vocab_size, "seed": seed}
    if cfg.source == "mooncake":
        return load_mooncake(cfg.path, **kw)  # type: ignore[arg-type]
    if cfg.source == "azure":
        return load_azure(cfg.path, **kw)  # type: ignore[arg-type]
    return load_trace(cfg.path, cfg.columns, **kw)  # type: ignore[arg-type]


def build_workload(cfg: WorkloadConfig, *, vocab_size: int = 32000) -> Workload:
    """Requests from the source, sent on the configured arrival process."""
    wl = _requests(cfg, vocab_size)
    n = len(wl)
    if cfg.arrival == "trace":
        if cfg.source not in _TRACES:
            raise ConfigError(f"workload.arrival 'trace' needs a trace source, not "
                              f"{cfg.source!r} (use poisson, gamma, constant or closed)")
        return wl
    if cfg.arrival == "closed":
        assert cfg.concurrency is not None
        return wl.closed_loop(cfg.concurrency)
    if cfg.arrival == "all-at-once":
        return wl.with_arrivals(arrivals.all_at_once(n), "all at t=0")
    assert cfg.rate is not None
    if cfg.arrival == "poisson":
        times = arrivals.poisson(n, cfg.rate, cfg.seed)
    elif cfg.arrival == "gamma":
        times = arrivals.gamma(n, cfg.rate, cfg.burstiness, cfg.seed)
    else:
        times = arrivals.constant(n, cfg.rate)
    return wl.with_arrivals(times, f"{cfg.arrival} {cfg.rate:g} req/s")


def scale_rate(wl: Workload, scale: float) -> Workload:
    """The same requests offered ``scale`` times faster (arrivals divided by ``scale``); a
    closed loop is returned unchanged."""
    if scale <= 0:
        raise ConfigError(f"load scale must be > 0, got {scale}")
    times = wl.arrivals()
    if times is None or scale == 1.0:
        return wl
    return wl.with_arrivals(times / scale, f"x{scale:g} rate")


def prepare_prompts(wl: Workload, *, token_ids: bool, vocab_size: int) -> Workload:
    """Fill in every request's prompt: token ids when the target is known to accept them
    (exact lengths, no tokenizer round trip), else text of about the target length."""
    reqs = []
    for r in wl.requests:
        p = r.prompt(token_ids, vocab_size)
        if isinstance(p, str):
            reqs.append(replace(r, prompt_text=p, prompt_token_ids=None))
        else:
            reqs.append(replace(r, prompt_token_ids=tuple(p), prompt_len=len(p)))
    return Workload(reqs, wl.source, wl.closed_loop_concurrency)
