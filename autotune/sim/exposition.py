"""vLLM 0.32's Prometheus ``/metrics`` page, driven by the simulated engine.

Families, types, HELP strings, labels and buckets are copied from a real vLLM 0.32 page
(``tests/data/captures/metrics_after.txt``; docs/vllm.md#6-prometheus-metrics), so
dashboards, the tuner's scraper and Prometheus rules written for real vLLM read the simulator
unchanged. Families the simulation cannot drive (multimodal and external prefix caches, MFU
estimates, sleep state, admission rejections) are exposed with the values a plain vLLM shows.

Each instance owns its own ``CollectorRegistry``: several simulated servers (and tests) in one
process must not share or collide on the global registry. All times passed in are engine
seconds, which are what the histograms report even when the server runs faster than wall time.
``process_*``/``python_*``/``http_*`` families are not exposed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autotune.sim.vllm_page import (
    ADMISSION_REASONS,
    CACHE_CONFIG_DEFAULTS,
    CACHED_SOURCES,
    FINISHED_REASONS,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    N_BUCKETS,
    PREEMPTION_BUCKETS,
    PROMPT_SOURCES,
    REQUEST_LATENCY_BUCKETS,
    SLEEP_STATES,
    TTFT_BUCKETS,
    WAITING_REASONS,
    build_1_2_5_buckets,
)

__all__ = ["VllmMetrics"]

_MFU_HELP = "(for Model Flops Utilization calculations)."
_WAITING_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
    "blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)
_SLEEP_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
_CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
    "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits."
)


class VllmMetrics:
    """The ``vllm:`` families of one engine (``engine="0"``) serving ``model_name``.

    Created in the order the real page lists them, so the rendered page reads like vLLM's.
    """

    CONTENT_TYPE: ClassVar[str] = "text/plain; version=0.0.4; charset=utf-8"
    """What prometheus_client serves a scraper that does not ask for another format."""

    def __init__(self, model_name: str, max_model_len: int, cache_labels: dict[str, str]) -> None:
        unknown = sorted(set(cache_labels) - set(CACHE_CONFIG_DEFAULTS))
        if unknown:
            # A misspelt label would silently add a label vLLM never exposes.
            raise ValueError(f"unknown vllm:cache_config_info labels: {', '.join(unknown)}")
        self.registry = CollectorRegistry()
        self._labels = {"model_name": model_name, "engine": "0"}
        tokens = build_1_2_5_buckets(max_model_len)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name", "engine"], registry=self.registry).labels(
                **self._labels
            )

        def counters(
            name: str, doc: str, label: str, values: Sequence[str], engine: bool = True
        ) -> dict[str, Counter]:
            base = {"model_name": model_name, **({"engine": "0"} if engine else {})}
            family = Counter(name, doc, [*base, label], registry=self.registry)
            return {v: family.labels(**base, **{label: v}) for v in values}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["model_name", "engine"], registry=self.registry).labels(
                **self._labels
            )

        def gauges(name: str, doc: str, label: str, values: Sequence[str]) -> dict[str, Gauge]:
            family = Gauge(name, doc, ["model_name", "engine", label], registry=self.registry)
            return {v: family.labels(**self._labels, **{label: v}) for v in values}

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(
                name, doc, ["model_name", "engine"], buckets=buckets, registry=self.registry
            ).labels(**self._labels)

        # Counters are named without `_total`: prometheus_client appends it (and `_created`).
        counter(
            "vllm:estimated_flops_per_gpu",
            f"Estimated number of floating point operations per GPU {_MFU_HELP}",
        )
        counter(
            "vllm:estimated_read_bytes_per_gpu",
            f"Estimated number of bytes read from memory per GPU {_MFU_HELP}",
        )
        counter(
            "vllm:estimated_write_bytes_per_gpu",
            f"Estimated number of bytes written to memory per GPU {_MFU_HELP}",
        )
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = gauges(
            "vllm:num_requests_waiting_by_reason", _WAITING_HELP, "reason", WAITING_REASONS
        )
        gauges("vllm:engine_sleep_state", _SLEEP_HELP, "sleep_state", SLEEP_STATES)["awake"].set(1)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counters(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            PROMPT_SOURCES,
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.prompt_cached_by_source = counters(
            "vllm:prompt_tokens_cached_by_source", _CACHED_BY_SOURCE_HELP, "source", CACHED_SOURCES
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_success = counters(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            FINISHED_REASONS,
        )
        # The one family without `engine` on the real page: admission happens in the frontend.
        self.admission_rejections = counters(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            "reason",
            ADMISSION_REASONS,
            engine=False,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        # A histogram despite the `_total` in its name, as in vLLM.
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        # An info-style gauge (value 1); its labels carry the cache config, no model_name.
        info = {"engine": "0", **CACHE_CONFIG_DEFAULTS, **cache_labels}
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=self.registry,
        ).labels(**info).set(1)

    def observe_step(
        self,
        *,
        iteration_tokens: int,
        prompt_tokens: int,
        generation_tokens: int,
        running: int,
        waiting: int,
        kv_usage: float,
        preemptions: int,
        prefix_queries: int,
        prefix_hits: int,
    ) -> None:
        """Record one engine step.

        ``prompt_tokens`` (``vllm:prompt_tokens_total``) is the sum of the *whole* prompts of
        the requests whose first token this step emitted, prefix-cache hits included: not
        the tokens the step computed. Real 0.32 counted 640 for one 320-token prompt sent
        twice, 384 computed plus 256 cached (tests/data/captures/prompt_tokens_cached.txt).
        ``preemptions``, ``prefix_queries`` and ``prefix_hits`` (tokens) are this step's
        increments; the gauges take the step's values.
        """
        self.iteration_tokens.observe(iteration_tokens)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.running.set(running)
        self.waiting.set(waiting)
        # The simulator has no LoRA/KV-transfer deferrals: every waiting request waits for
        # capacity, so the by-reason split sums to num_requests_waiting as vLLM promises.
        self.waiting_by_reason["capacity"].set(waiting)
        self.kv_usage.set(kv_usage)
        self.preemptions.inc(preemptions)
        self.prefix_queries.inc(prefix_queries)
        self.prefix_hits.inc(prefix_hits)

    def observe_itl(self, gaps: Sequence[float]) -> None:
        """Record the inter-token latencies (s) of the tokens one step emitted."""
        for gap in gaps:
            self.itl.observe(gap)

    def observe_finished(
        self,
        *,
        finished_reason: str,
        prompt_tokens: int,
        generation_tokens: int,
        max_tokens: int,
        n: int,
        arrival: float,
        scheduled: float,
        first_token: float,
        finish: float,
        num_preemptions: int,
        core_first_token: float | None = None,
        core_finish: float | None = None,
        prefill_computed_tokens: int,
        cached_prompt_tokens: int,
    ) -> None:
        """Record one finished request (engine-second timestamps), as vLLM's logger does.

        ``first_token`` and ``finish``: when the API server handed out the first and last
        token (vLLM's front end times TTFT and end-to-end latency); ``core_first_token`` and
        ``core_finish``: when the engine core's steps produced them (default: the same),
        which vLLM's queue, prefill, decode and inference times use, its engine-core
        timestamps (docs/simulator.md#34-the-api-server).

        One call is one request: ``n`` and the max generation length are observed per call,
        which is exact for ``n == 1``. ``max_tokens`` of 0 means "not set" and, as in vLLM,
        is not observed.
        """
        if finished_reason not in self.request_success:
            raise ValueError(f"unknown finished_reason {finished_reason!r}")
        self.request_success[finished_reason].inc()
        core_first = first_token if core_first_token is None else core_first_token
        core_end = finish if core_finish is None else core_finish
        decode = core_end - core_first
        self.e2e.observe(finish - arrival)
        # vLLM observes TTFT when the first token comes out; doing it at finish only delays it.
        self.ttft.observe(first_token - arrival)
        self.queue_time.observe(scheduled - arrival)
        self.prefill_time.observe(core_first - scheduled)
        self.inference_time.observe(core_end - scheduled)
        self.decode_time.observe(decode)
        self.tpot.observe(decode / (generation_tokens - 1) if generation_tokens > 1 else 0.0)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generation_tokens)
        self.max_generation_tokens.observe(generation_tokens)
        self.params_n.observe(n)
        if max_tokens:
            self.params_max_tokens.observe(max_tokens)
        self.request_preemptions.observe(num_preemptions)
        self.prefill_kv_computed.observe(prefill_computed_tokens)
        # All cache hits are local (device) in the simulator: no offloading, no KV connector.
        self.prompt_cached.inc(cached_prompt_tokens)
        self.prompt_cached_by_source["device"].inc(cached_prompt_tokens)
        self.prompt_by_source["local_cache_hit"].inc(cached_prompt_tokens)
        self.prompt_by_source["local_compute"].inc(prompt_tokens - cached_prompt_tokens)

    def render(self) -> bytes:
        """The page in Prometheus text format 0.0.4 (what :attr:`CONTENT_TYPE` names)."""
        return generate_latest(self.registry)
