"""Build the workload a study config (or ``autotune bench``'s flags) describes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from autotune.config import ModelConfig, StudyConfig, WorkloadConfig
from autotune.errors import ConfigError
from autotune.workload import arrivals
from autotune.workload.core import Workload
from autotune.workload.resample import bootstrap, stratified_bootstrap
from autotune.workload.sources import (
    LogNormal,
    load_sharegpt,
    random_workload,
    sharegpt_like_workload,
    synthetic_workload,
)
from autotune.workload.text import TokenCounter, local_token_counter
from autotune.workload.traces import load_azure, load_mooncake, load_trace

__all__ = [
    "bootstrap",
    "build_workload",
    "measured_lengths_path",
    "model_folder",
    "prepare_prompts",
    "sample_description",
    "save_measured_lengths",
    "scale_rate",
    "study_workload",
    "with_lengths",
    "workload_sample",
]

_TRACES = ("mooncake", "azure", "trace")


def _requests(cfg: WorkloadConfig, vocab_size: int, count: TokenCounter | None) -> Workload:
    n, seed = cfg.num_prompts, cfg.seed
    if cfg.source == "synthetic":
        return synthetic_workload(
            n,
            LogNormal(cfg.input_len, cfg.input_sigma),
            LogNormal(cfg.output_len, cfg.output_sigma),
            seed=seed,
        )
    if cfg.source == "sharegpt-like":
        return sharegpt_like_workload(n, seed=seed)
    if cfg.source == "random":
        return random_workload(
            n,
            input_len=cfg.input_len,
            output_len=cfg.output_len,
            range_ratio=cfg.range_ratio,
            seed=seed,
            vocab_size=vocab_size,
        )
    assert cfg.path is not None  # the config validator demands it for file sources
    if cfg.source == "sharegpt":
        return load_sharegpt(cfg.path, n, seed=seed, count_tokens=count)
    kw = {
        "time_scale": cfg.time_scale,
        "rate_scale": cfg.rate_scale,
        "max_requests": n,
        "vocab_size": vocab_size,
        "seed": seed,
    }
    if cfg.source == "mooncake":  # lengths and hash ids only: no text to count
        return load_mooncake(cfg.path, **kw)  # type: ignore[arg-type]
    if cfg.source == "azure":
        return load_azure(cfg.path, **kw)  # type: ignore[arg-type]
    return load_trace(cfg.path, cfg.columns, **kw, count_tokens=count)  # type: ignore[arg-type]


def build_workload(
    cfg: WorkloadConfig, *, vocab_size: int = 32000, count_tokens: TokenCounter | None = None
) -> Workload:
    """Requests from the source, sent on the configured arrival process. ``count_tokens``
    measures text prompts (ShareGPT, traces with a prompt column); by default the
    approximate word rule of :func:`~autotune.workload.text.approx_token_count`."""
    wl = _requests(cfg, vocab_size, count_tokens)
    n = len(wl)
    if cfg.arrival == "trace":
        if cfg.source not in _TRACES:
            raise ConfigError(
                f"workload.arrival 'trace' needs a trace source, not "
                f"{cfg.source!r} (use poisson, gamma, constant or closed)"
            )
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


def model_folder(model: ModelConfig) -> Path | None:
    """The local model folder a study names (``model.name`` or ``model.config_json``'s
    folder), where its tokenizer files are; None for built-in profiles and hub names."""
    for candidate in (model.name, model.config_json):
        if candidate:
            p = Path(candidate)
            p = p if p.is_dir() else p.parent if p.name == "config.json" else p
            if p.is_dir() and (p / "config.json").is_file():
                return p
    return None


def with_lengths(wl: Workload, lengths: Mapping[str, int]) -> Workload:
    """``wl`` with the prompt lengths of the requests named in ``lengths`` replaced."""
    reqs = [
        replace(r, prompt_len=lengths[r.request_id])
        if r.request_id in lengths and r.prompt_token_ids is None
        else r
        for r in wl.requests
    ]
    return Workload(reqs, wl.source, wl.closed_loop_concurrency, wl.dropped)


def measured_lengths_path(cfg: StudyConfig, wl: Workload) -> Path:
    """Where the server-measured lengths of ``wl``'s text prompts are kept: per model,
    endpoint and text content (request ids and texts), not per study, so that re-creating
    a study finds them (docs/loadgen.md#43-text-datasets)."""
    h = hashlib.sha256()
    h.update(json.dumps([cfg.model.name, cfg.model.served_name, cfg.workload.endpoint]).encode())
    for r in wl.requests:
        if r.prompt_text is not None:
            h.update(r.request_id.encode() + b"\0")
            h.update(hashlib.sha256(r.prompt_text.encode("utf-8", "surrogatepass")).digest())
    return Path(cfg.worker.workdir) / "measured-lengths" / f"{h.hexdigest()[:32]}.json"


def save_measured_lengths(path: Path, lengths: Mapping[str, int]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(lengths), sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot save measured prompt lengths ({exc})") from exc


def _load_lengths(path: Path) -> dict[str, int] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        return None
    return {str(k): int(v) for k, v in data.items()}


def study_workload(
    cfg: StudyConfig, *, vocab_size: int, expect_fingerprint: str | None = None
) -> Workload:
    """The study's workload with the best prompt lengths known for its text prompts: the
    server's own counts saved by an earlier first trial, else the model folder's tokenizer
    (``tokenizers`` installed), else the approximate word rule.

    ``expect_fingerprint`` (a stored study's) picks the variant the study was created with,
    so a study keeps running on the lengths it was created with when better ones appear.
    """
    folder = model_folder(cfg.model)
    count = local_token_counter(folder) if folder is not None else None
    base = build_workload(cfg.workload, vocab_size=vocab_size, count_tokens=count)
    if not any(r.prompt_text is not None for r in base.requests):
        return base
    saved = _load_lengths(measured_lengths_path(cfg, base))
    if saved is None:
        return base
    measured = with_lengths(base, saved)
    if expect_fingerprint is not None and measured.fingerprint() != expect_fingerprint:
        return base
    return measured


def workload_sample(cfg: StudyConfig, seed: int, *, vocab_size: int) -> tuple[Workload, str]:
    """Another sample of the study's workload, for re-measurements
    (docs/tuning.md#7-validation), and how it was drawn.

    Generated sources (synthetic, sharegpt-like, random) and ShareGPT are drawn again with
    ``seed`` as ``workload.seed``: new lengths and arrival times (ShareGPT: other
    conversations when the file holds more than ``num_prompts``). Trace sources (mooncake,
    azure, trace) are bootstrapped stratified by length
    (:func:`autotune.workload.resample.stratified_bootstrap`): the trace's own arrival times
    (or the configured arrival process drawn with ``seed``), its longest 1 % in every sample,
    every other slot carrying a request of similar length drawn with replacement.
    """
    folder = model_folder(cfg.model)
    count = local_token_counter(folder) if folder is not None else None
    wcfg = cfg.workload.model_copy(update={"seed": seed})
    wl = build_workload(wcfg, vocab_size=vocab_size, count_tokens=count)
    if cfg.workload.source in _TRACES:
        wl = stratified_bootstrap(wl, seed)
    return wl, sample_description(cfg, seed)


def sample_description(cfg: StudyConfig, seed: int) -> str:
    """How :func:`workload_sample` draws the sample of ``seed``, in words."""
    if cfg.workload.source in _TRACES:
        return f"trace bootstrap stratified by length, seed {seed}"
    return f"workload seed {seed}"
