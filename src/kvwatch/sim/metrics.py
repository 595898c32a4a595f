"""Render engine snapshots as the ``/metrics`` text of a given vLLM generation (pure).

Families, label sets and buckets follow vLLM's own ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``,
V1) and ``Metrics`` (``vllm/engine/metrics.py``, V0) per version profile. Names, types and HELP texts are not
written here: they come from the catalogue of vLLM's definitions per version, ``kvwatch/data/vllm_catalogue.json``
(:func:`definition`); this module only says which families a profile renders, in which order, with which
values. The text itself is produced by ``prometheus_client`` (what vLLM
uses), so number formatting, label order, ``_total`` and ``_created`` samples come out as vLLM's do.

Families that V1 only emits behind a feature switch (LoRA, speculative decoding, KV connectors,
``--kv-cache-metrics``, MFU) are not rendered; V0 registers its LoRA and speculative-decoding families
unconditionally, so the ``v0`` profile has them (see ``_render_v0``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from kvwatch.sim import buckets
from kvwatch.sim.engine import EngineSnapshot, HistogramSnapshot

PROFILES = ("0.33", "0.10", "0.8", "v0")
DEFAULT_PROFILE = PROFILES[0]  # the newest vLLM's names
# Profiles whose labels carry no `engine` (one series per endpoint, so one engine).
SINGLE_ENGINE_PROFILES = frozenset({"0.8", "v0"})
# Profiles that can serve /metrics through prometheus_client's multiprocess mode: V1 with --api-server-count > 1,
# and V0, whose default (multiprocessing) OpenAI frontend always sets PROMETHEUS_MULTIPROC_DIR. V1 0.8.x had one
# API server.
MULTIPROCESS_PROFILES = frozenset({"0.33", "0.10", "v0"})
DEFAULT_START_TIME = 1_750_000_000.0  # unix time the simulated process "started" (for *_created)



@cache
def _catalogue() -> dict[str, Any]:
    return json.loads(resources.files("kvwatch").joinpath("data/vllm_catalogue.json").read_text())


def definition(profile: str, wire_name: str) -> dict[str, Any]:
    """The catalogue's definition of a family (``type``, ``labels``, ``help``, ...) as ``profile`` exposes it.

    ``wire_name`` is the family's name on the wire: a counter's ends in ``_total``. prometheus_client's own
    collectors (GC, platform, process) are the catalogue's ``runtime_families``, the same for every profile.
    """
    catalogue = _catalogue()
    for families in (catalogue["profiles"][profile], catalogue["runtime_families"]["families"]):
        if wire_name in families:
            return families[wire_name]
    raise KeyError(f"{wire_name} is not in vllm_catalogue.json for vLLM profile {profile}")


def _prefix(bounds: Sequence[float], upto: float) -> tuple[float, ...]:
    return tuple(b for b in bounds if b <= upto)


# Bucket sets per profile: (ttft, tpot/itl, request latency); iteration tokens: _iteration_buckets.
_BUCKETS = {
    "0.33": (buckets.TTFT_SECONDS, buckets.ITL_SECONDS, buckets.REQUEST_LATENCY_SECONDS),
    "0.10": (buckets.TTFT_SECONDS, buckets.ITL_SECONDS, buckets.REQUEST_LATENCY_SECONDS),
    "0.8": (_prefix(buckets.TTFT_SECONDS, 10.0), _prefix(buckets.ITL_SECONDS, 2.5),
            _prefix(buckets.REQUEST_LATENCY_SECONDS, 60.0)),
    "v0": (_prefix(buckets.TTFT_SECONDS, 10.0), _prefix(buckets.ITL_SECONDS, 2.5),
           _prefix(buckets.REQUEST_LATENCY_SECONDS, 60.0)),
}


def _iteration_buckets(profile: str, max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """``vllm:iteration_tokens_total`` buckets: CUDA-graph capture sizes up to 0.8.x, fixed from 0.9/0.10."""
    if profile == "v0":
        return buckets.iteration_tokens_v0(max_num_seqs)
    if profile == "0.8":
        return buckets.iteration_tokens_v1_08(max_num_batched_tokens)
    return buckets.ITERATION_TOKENS

_FINISH_REASONS = {
    "0.33": ("stop", "length", "abort", "error", "repetition"),
    "0.10": ("stop", "length", "abort"),
    "0.8": ("stop", "length", "abort"),
    "v0": ("stop", "length", "abort"),
}


# prometheus_client's multiprocess mode keeps one value file per kind (and gauge mode) and process, and its
# collector reads them one file after another: families come out grouped by file, each file in the order its
# series were first written. The order of the files is the directory's (arbitrary); this one puts
# mostrecent before sum, as the real V0 capture shows.
_MP_FILE_ORDER = ("gauge_mostrecent", "gauge_sum", "gauge_livemostrecent", "gauge_all", "counter", "histogram")


@dataclass
class _Builder:
    """Collects families in order, then lets prometheus_client format them.

    ``multiprocess``: render as prometheus_client's ``MultiProcessCollector`` does (vLLM with
    ``PROMETHEUS_MULTIPROC_DIR`` set): no ``*_created``, labels sorted, a ``pid`` label on gauges without a
    ``multiprocess_mode``, per series ``_sum`` then the buckets then ``_count``, families grouped by value
    file, and no family that no process ever wrote (a multiprocess registry knows only written series).
    """

    profile: str
    multiprocess: bool
    start_time: float
    pid: int
    families: list[tuple[str, Metric]] = field(default_factory=list)  # (multiprocess value file, family)

    @property
    def created(self) -> bool:
        # V0 disabled *_created (prometheus_client.disable_created_metrics); multiprocess mode never has them.
        return self.profile != "v0" and not self.multiprocess

    def _labels(self, labels: dict[str, str]) -> dict[str, str]:
        return dict(sorted(labels.items())) if self.multiprocess else labels

    def add(self, metric: Metric, value_file: str) -> None:
        self.families.append((value_file, metric))

    def metric(self, name: str, kind: str) -> Metric:
        """An empty family with the catalogue's HELP for this profile (``name`` as in vLLM's code: a counter's
        without ``_total``)."""
        spec = definition(self.profile, name + "_total" if kind == "counter" else name)
        if spec["type"] != kind:
            raise ValueError(f"{name} is a {spec['type']} in vllm_catalogue.json, rendered as a {kind}")
        return Metric(name, spec["help"], kind)

    def gauge(self, name: str, samples: Iterable[tuple[dict[str, str], float]],
              mp_mode: str | None = "mostrecent") -> None:
        """``mp_mode``: the gauge's ``multiprocess_mode``; None (none given, prometheus_client's "all") makes
        multiprocess mode add a ``pid`` label."""
        metric = self.metric(name, "gauge")
        for labels, value in samples:
            if self.multiprocess and mp_mode is None:
                labels = {**labels, "pid": str(self.pid)}
            metric.add_sample(name, self._labels(labels), float(value))
        self.add(metric, f"gauge_{mp_mode or 'all'}")

    def counter(self, name: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        """``name`` without ``_total`` (as in vLLM's code); the wire name gets ``_total``."""
        metric = self.metric(name, "counter")
        rows = list(samples)
        for labels, value in rows:
            metric.add_sample(name + "_total", self._labels(labels), float(value))
        if self.created:
            for labels, _ in rows:
                metric.add_sample(name + "_created", labels, self.start_time)
        self.add(metric, "counter")

    def histogram(self, name: str, bounds: Sequence[float],
                  samples: Iterable[tuple[dict[str, str], HistogramSnapshot]]) -> None:
        metric = self.metric(name, "histogram")
        rows = list(samples)
        for labels, hist in rows:
            cumulative = hist.cumulative(bounds)
            if self.multiprocess:  # MultiProcessCollector: per series _sum, then the buckets, then _count
                metric.add_sample(name + "_sum", self._labels(labels), hist.sum)
            for bound, count in zip((*bounds, float("inf")), cumulative, strict=True):
                metric.add_sample(name + "_bucket", self._labels({**labels, "le": floatToGoString(bound)}),
                                  float(count))
            metric.add_sample(name + "_count", self._labels(labels), float(hist.count))
            if not self.multiprocess:
                metric.add_sample(name + "_sum", labels, hist.sum)
        if self.created:
            for labels, _ in rows:
                metric.add_sample(name + "_created", labels, self.start_time)
        self.add(metric, "histogram")

    def text(self) -> str:
        if self.multiprocess:
            order = {value_file: i for i, value_file in enumerate(_MP_FILE_ORDER)}
            chosen = sorted((pair for pair in self.families if pair[1].samples), key=lambda pair: order[pair[0]])
        else:
            chosen = self.families
        families = [metric for _, metric in chosen]

        class _Registry:
            def collect(self) -> Iterable[Metric]:
                return iter(families)

        return generate_latest(_Registry()).decode()  # type: ignore[arg-type]


DEFAULT_MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class _Config:
    """The server's configuration as far as /metrics shows it."""

    model_name: str
    max_model_len: int
    gpu_memory_utilization: float | None
    enable_prefix_caching: bool
    start_time: float
    max_num_seqs: int
    max_num_batched_tokens: int


def render(snaps: Sequence[EngineSnapshot], profile: str = DEFAULT_PROFILE, *, model_name: str = DEFAULT_MODEL_NAME,
           multiprocess: bool = False, max_model_len: int = 8192, start_time: float = DEFAULT_START_TIME,
           pid: int = 1, gpu_memory_utilization: float | None = None, enable_prefix_caching: bool = False,
           max_num_seqs: int = 256, max_num_batched_tokens: int = 8192) -> str:
    """The ``/metrics`` body vLLM ``profile`` would serve for these engines (one snapshot per DP engine).

    ``max_num_seqs`` and ``max_num_batched_tokens`` only shape the ``iteration_tokens_total`` buckets of the
    profiles that used CUDA-graph capture sizes (``v0``, ``0.8``).
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown vLLM profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if not snaps:
        raise ValueError("render needs at least one engine snapshot")
    if profile in SINGLE_ENGINE_PROFILES and len(snaps) > 1:
        raise ValueError(f"vLLM {profile} has no engine label: it cannot expose {len(snaps)} data-parallel engines")
    if multiprocess and profile not in MULTIPROCESS_PROFILES:
        raise ValueError(f"vLLM {profile} has no multiprocess metrics mode")
    if max_model_len < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise ValueError("max_model_len, max_num_seqs and max_num_batched_tokens must be >= 1")
    config = _Config(model_name, max_model_len, gpu_memory_utilization, enable_prefix_caching, start_time,
                     max_num_seqs, max_num_batched_tokens)
    # (*_created is when the counter was made: the latest restart's start, as process_start_time_seconds says; it kept
    # the first start's through a restart, so a reader of _created saw no reset)
    b = _Builder(profile, multiprocess, start_time + max(s.started_at for s in snaps), pid)
    if not multiprocess:  # the default registry's collectors; a multiprocess registry has only vLLM's families
        _render_runtime(b, snaps, start_time)
    if profile == "v0":
        _render_v0(b, snaps[0], config)
    else:
        _render_v1(b, snaps, profile, config)
    return b.text()


def _render_runtime(b: _Builder, snaps: Sequence[EngineSnapshot], start_time: float) -> None:
    """prometheus_client's GC, platform and process collectors, with plausible values for a vLLM server.

    ``process_start_time_seconds`` moves with a simulated restart, as it does when a pod restarts.
    """
    started = max(s.started_at for s in snaps)
    uptime = max(0.0, snaps[0].time - started)
    generations = ("0", "1", "2")
    for name, per_second in (
        ("python_gc_objects_collected", (120.0, 11.0, 0.5)),
        ("python_gc_objects_uncollectable", (0.0, 0.0, 0.0)),
        ("python_gc_collections", (2.1, 0.19, 0.017)),
    ):
        metric = b.metric(name, "counter")
        for generation, rate in zip(generations, per_second, strict=True):
            metric.add_sample(name + "_total", {"generation": generation}, float(int(rate * uptime)))
        b.add(metric, "counter")
    b.gauge("python_info",
            [({"implementation": "CPython", "major": "3", "minor": "12", "patchlevel": "3", "version": "3.12.3"}, 1)])
    b.gauge("process_virtual_memory_bytes", [({}, 1.2e10)])
    b.gauge("process_resident_memory_bytes", [({}, 3.1e9)])
    b.gauge("process_start_time_seconds", [({}, round(start_time + started, 2))])
    cpu = b.metric("process_cpu_seconds", "counter")
    cpu.add_sample("process_cpu_seconds_total", {}, round(1.1 * uptime, 2))
    b.add(cpu, "counter")
    b.gauge("process_open_fds", [({}, 120)])
    b.gauge("process_max_fds", [({}, 1048576)])


def _render_v1(b: _Builder, snaps: Sequence[EngineSnapshot], profile: str, c: _Config) -> None:
    with_engine = profile not in SINGLE_ENGINE_PROFILES
    model_name = c.model_name
    iteration = _iteration_buckets(profile, c.max_num_seqs, c.max_num_batched_tokens)

    def base(s: EngineSnapshot) -> dict[str, str]:
        return {"model_name": model_name, "engine": str(s.engine)} if with_engine else {"model_name": model_name}

    def per(fn: Callable[[EngineSnapshot], float]) -> list[tuple[dict[str, str], float]]:
        return [(base(s), fn(s)) for s in snaps]

    ttft, tpot, latency = _BUCKETS[profile]
    tokens = buckets.build_1_2_5_buckets(c.max_model_len)
    new = profile == "0.33"

    b.gauge("vllm:num_requests_running", per(lambda s: s.num_running))
    b.gauge("vllm:num_requests_waiting", per(lambda s: s.num_waiting))
    if new:
        b.gauge("vllm:num_requests_waiting_by_reason",
                [({**base(s), "reason": r}, s.num_waiting_capacity if r == "capacity" else 0)
                 for s in snaps for r in ("capacity", "deferred")])
        b.gauge("vllm:engine_sleep_state",
                [({**base(s), "sleep_state": st}, 1 if st == "awake" else 0)
                 for s in snaps for st in ("awake", "weights_offloaded", "discard_all")])
    if profile == "0.8":
        b.gauge("vllm:gpu_cache_usage_perc", per(lambda s: s.kv_usage))
        b.counter("vllm:gpu_prefix_cache_queries", per(lambda s: s.prefix_cache_queries_blocks))
        b.counter("vllm:gpu_prefix_cache_hits", per(lambda s: s.prefix_cache_hits_blocks))
    if profile == "0.10":
        b.gauge("vllm:gpu_cache_usage_perc", per(lambda s: s.kv_usage))
        b.counter("vllm:gpu_prefix_cache_queries", per(lambda s: s.prefix_cache_queries_tokens))
        b.counter("vllm:gpu_prefix_cache_hits", per(lambda s: s.prefix_cache_hits_tokens))
    if profile in ("0.10", "0.33"):
        # 0.9-0.11 registered this gauge without a multiprocess_mode; 0.12+ uses "mostrecent".
        b.gauge("vllm:kv_cache_usage_perc", per(lambda s: s.kv_usage),
                mp_mode=None if profile == "0.10" else "mostrecent")
        b.counter("vllm:prefix_cache_queries", per(lambda s: s.prefix_cache_queries_tokens))
        b.counter("vllm:prefix_cache_hits", per(lambda s: s.prefix_cache_hits_tokens))
    if new:
        b.counter("vllm:external_prefix_cache_queries", per(lambda s: 0))
        b.counter("vllm:external_prefix_cache_hits", per(lambda s: 0))
        b.counter("vllm:mm_cache_queries", per(lambda s: 0))
        b.counter("vllm:mm_cache_hits", per(lambda s: 0))
    b.counter("vllm:num_preemptions", per(lambda s: s.preemptions_total))
    b.counter("vllm:prompt_tokens", per(lambda s: s.prompt_tokens_total))
    if new:
        b.counter("vllm:prompt_tokens_by_source",
                  [({**base(s), "source": src}, v) for s in snaps for src, v in (
                      ("local_compute", s.prompt_tokens_total - s.prompt_tokens_cached_total),
                      ("local_cache_hit", s.prompt_tokens_cached_total),
                      ("external_kv_transfer", 0))])
        b.counter("vllm:prompt_tokens_cached", per(lambda s: s.prompt_tokens_cached_total))
        # Incremented by the same prefix_cache_stats.hits as vllm:prefix_cache_hits (all local: "device"); the
        # other tiers need a KV connector. Every source is pre-created per engine.
        b.counter("vllm:prompt_tokens_cached_by_source",
                  [({**base(s), "source": src}, s.prefix_cache_hits_tokens if src == "device" else 0)
                   for src in ("device", "host", "p2p", "disk", "external_unspecified") for s in snaps])
    b.counter("vllm:generation_tokens", per(lambda s: s.generation_tokens_total))
    b.counter("vllm:request_success",
              [({**base(s), "finished_reason": r}, s.finished_by_reason.get(r, 0))
               for s in snaps for r in _FINISH_REASONS[profile]])
    if new:
        b.counter("vllm:admission_rejections",
                  [({"model_name": model_name, "reason": r}, 0)
                   for r in ("max_num_queued_reqs", "max_num_queued_tokens")])

    def hist(name: str, bounds: Sequence[float], key: str) -> None:
        b.histogram(name, bounds, [(base(s), s.histograms[key]) for s in snaps])

    hist("vllm:request_prompt_tokens", tokens, "request_prompt_tokens")
    hist("vllm:request_generation_tokens", tokens, "request_generation_tokens")
    hist("vllm:iteration_tokens_total", iteration, "iteration_tokens" if new else "iteration_tokens_full_prompt")
    hist("vllm:request_max_num_generation_tokens", tokens, "request_max_num_generation_tokens")
    hist("vllm:request_params_n", buckets.PARAMS_N, "request_params_n")
    hist("vllm:request_params_max_tokens", tokens, "request_params_max_tokens")
    if new:
        hist("vllm:request_prefill_kv_computed_tokens", tokens, "request_prefill_kv_computed_tokens")
        hist("vllm:request_num_preemptions", buckets.NUM_PREEMPTIONS, "request_num_preemptions")
    hist("vllm:time_to_first_token_seconds", ttft, "time_to_first_token_seconds")
    if new:
        hist("vllm:inter_token_latency_seconds", tpot, "inter_token_latency_seconds")
        hist("vllm:request_time_per_output_token_seconds", tpot, "request_time_per_output_token_seconds")
    else:
        hist("vllm:time_per_output_token_seconds", tpot, "inter_token_latency_seconds")
    hist("vllm:e2e_request_latency_seconds", latency, "e2e_request_latency_seconds")
    for key in ("queue", "inference", "prefill", "decode"):  # vLLM's WAITING, RUNNING, PREFILL, DECODE phases
        hist(f"vllm:request_{key}_time_seconds", latency, f"request_{key}_time_seconds")
    # One series per engine; without an engine label (0.8) there is one engine anyway.
    b.gauge("vllm:cache_config_info", [(_cache_config_labels(profile, s, snaps, c), 1) for s in snaps])


def _render_v0(b: _Builder, s: EngineSnapshot, c: _Config) -> None:
    """V0's ``Metrics`` (vllm/engine/metrics.py, 0.6-0.7) as its ``_log_prometheus`` leaves them after ``s``.

    V0 registers every family, LoRA and speculative decoding included, but a labelled family gets a series only
    when first set or observed: histograms once something was observed, ``request_success`` only for the
    reasons seen, ``tokens_total`` never (nothing increments it), ``model_{forward,execute}_time_milliseconds``
    only with ``--collect-detailed-traces``, spec decode only with a draft model. Those render as bare HELP/TYPE
    lines in the default registry and not at all in multiprocess mode (V0's default frontend).
    """
    base = {"model_name": c.model_name}
    ttft, tpot, latency = _BUCKETS["v0"]
    iteration = _iteration_buckets("v0", c.max_num_seqs, c.max_num_batched_tokens)
    tokens = buckets.build_1_2_5_buckets(c.max_model_len)
    h = s.histograms

    def observed(key: str) -> list[tuple[dict[str, str], HistogramSnapshot]]:
        return [(base, h[key])] if h[key].count else []

    # -1 is V0's "prefix caching disabled" (NaiveBlockAllocator.get_prefix_cache_hit_rate).
    gpu_hit_rate, cpu_hit_rate = -1.0, -1.0
    if c.enable_prefix_caching:
        q = s.prefix_cache_queries_blocks
        gpu_hit_rate, cpu_hit_rate = (s.prefix_cache_hits_blocks / q if q else 0.0), 0.0
    never: list = []
    families = {
        "cache_config_info": lambda: b.gauge(
            "vllm:cache_config_info", [(_cache_config_labels("v0", s, [s], c), 1)], mp_mode="mostrecent"),
        "running": lambda: b.gauge("vllm:num_requests_running", [(base, s.num_running)], mp_mode="sum"),
        "waiting": lambda: b.gauge("vllm:num_requests_waiting", [(base, s.num_waiting)], mp_mode="sum"),
        # Set on every log call, LoRA or not; the value is the unix time of that call (set_to_current_time).
        "lora": lambda: b.gauge("vllm:lora_requests_info",
                                [({"running_lora_adapters": "", "max_lora": "0", "waiting_lora_adapters": ""},
                                  round(c.start_time + s.time, 3))], mp_mode="livemostrecent"),
        "swapped": lambda: b.gauge("vllm:num_requests_swapped", [(base, 0)], mp_mode="sum"),
        "gpu_usage": lambda: b.gauge("vllm:gpu_cache_usage_perc", [(base, s.kv_usage)], mp_mode="sum"),
        "cpu_usage": lambda: b.gauge("vllm:cpu_cache_usage_perc", [(base, 0)], mp_mode="sum"),
        "cpu_hit": lambda: b.gauge("vllm:cpu_prefix_cache_hit_rate", [(base, cpu_hit_rate)], mp_mode="sum"),
        "gpu_hit": lambda: b.gauge("vllm:gpu_prefix_cache_hit_rate", [(base, gpu_hit_rate)], mp_mode="sum"),
        "preemptions": lambda: b.counter("vllm:num_preemptions", [(base, s.preemptions_total)]),
        "prompt": lambda: b.counter("vllm:prompt_tokens", [(base, s.prompt_tokens_total)]),
        "generation": lambda: b.counter("vllm:generation_tokens", [(base, s.generation_tokens_total)]),
        "tokens": lambda: b.counter("vllm:tokens", never),
        "iteration": lambda: b.histogram("vllm:iteration_tokens_total", iteration, observed("iteration_tokens_v0")),
        "ttft": lambda: b.histogram("vllm:time_to_first_token_seconds", ttft, observed("time_to_first_token_seconds")),
        "tpot": lambda: b.histogram("vllm:time_per_output_token_seconds", tpot,
                                    observed("inter_token_latency_seconds")),
        "e2e": lambda: b.histogram("vllm:e2e_request_latency_seconds", latency,
                                   observed("e2e_request_latency_seconds")),
        **{phase: (lambda key=key: b.histogram(f"vllm:request_{key}_time_seconds", latency,
                                               observed(f"request_{key}_time_seconds")))
           for phase, key in (("WAITING", "queue"), ("RUNNING", "inference"), ("PREFILL", "prefill"),
                              ("DECODE", "decode"))},
        # first_scheduled - arrival, as request_queue_time_seconds.
        "in_queue": lambda: b.histogram("vllm:time_in_queue_requests", latency,
                                        observed("request_queue_time_seconds")),
        "forward": lambda: b.histogram("vllm:model_forward_time_milliseconds", buckets.MODEL_TIME_MS_V0, never),
        "execute": lambda: b.histogram("vllm:model_execute_time_milliseconds", buckets.MODEL_TIME_MS_V0, never),
        "prompt_req": lambda: b.histogram("vllm:request_prompt_tokens", tokens, observed("request_prompt_tokens")),
        "generation_req": lambda: b.histogram("vllm:request_generation_tokens", tokens,
                                              observed("request_generation_tokens")),
        "max_generation": lambda: b.histogram("vllm:request_max_num_generation_tokens", tokens,
                                              observed("request_max_num_generation_tokens")),
        "n": lambda: b.histogram("vllm:request_params_n", buckets.PARAMS_N, observed("request_params_n")),
        "max_tokens": lambda: b.histogram("vllm:request_params_max_tokens", tokens,
                                          observed("request_params_max_tokens")),
        "success": lambda: b.counter("vllm:request_success",
                                     [({**base, "finished_reason": r}, n) for r in _FINISH_REASONS["v0"]
                                      if (n := s.finished_by_reason.get(r, 0))]),
        "spec_rate": lambda: b.gauge("vllm:spec_decode_draft_acceptance_rate", never, mp_mode="sum"),
        "spec_efficiency": lambda: b.gauge("vllm:spec_decode_efficiency", never, mp_mode="sum"),
        "spec_accepted": lambda: b.counter("vllm:spec_decode_num_accepted_tokens", never),
        "spec_draft": lambda: b.counter("vllm:spec_decode_num_draft_tokens", never),
        "spec_emitted": lambda: b.counter("vllm:spec_decode_num_emitted_tokens", never),
    }
    if b.multiprocess:
        # The order series are first written in: cache_config_info at start-up, then _log_prometheus's order
        # (request_success and the per-request histograms with the first finished request).
        order = ("cache_config_info", "running", "swapped", "waiting", "gpu_usage", "cpu_usage", "cpu_hit", "gpu_hit",
                 "lora", "preemptions", "prompt", "generation", "iteration", "ttft", "tpot", "e2e", "WAITING",
                 "RUNNING", "PREFILL", "DECODE", "in_queue", "forward", "execute", "success", "prompt_req",
                 "generation_req", "n", "max_generation", "max_tokens", "tokens", "spec_rate", "spec_efficiency",
                 "spec_accepted", "spec_draft", "spec_emitted")
    else:
        # Registration order (Metrics.__init__); cache_config_info is registered last, by StatLogger.info().
        order = ("running", "waiting", "lora", "swapped", "gpu_usage", "cpu_usage", "cpu_hit", "gpu_hit", "preemptions",
                 "prompt", "generation", "tokens", "iteration", "ttft", "tpot", "e2e", "WAITING", "RUNNING", "PREFILL",
                 "DECODE", "in_queue", "forward", "execute", "prompt_req", "generation_req", "max_generation", "n",
                 "max_tokens", "success", "spec_rate", "spec_efficiency", "spec_accepted", "spec_draft",
                 "spec_emitted", "cache_config_info")
    assert sorted(order) == sorted(families)
    for name in order:
        families[name]()


def _cache_config_labels(profile: str, s: EngineSnapshot, snaps: Sequence[EngineSnapshot],
                         c: _Config) -> dict[str, str]:
    """``CacheConfig.metrics_info()``: every field as ``str(value)``; num_gpu_blocks summed over DP engines.

    The simulated cache size is given, not profiled, so it is vLLM's ``--num-gpu-blocks-override`` (per
    engine, echoed as such, as the real V0 capture does); ``enable_prefix_caching`` is what the engine does.
    """
    total_blocks = sum(x.num_gpu_blocks for x in snaps)
    gmu = c.gpu_memory_utilization
    max_model_len = c.max_model_len
    common = {
        "block_size": str(s.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(c.enable_prefix_caching),
        "num_gpu_blocks_override": str(s.num_gpu_blocks),
        "sliding_window": "None",
    }
    if profile == "v0":
        return {**common, "cpu_offload_gb": "0", "gpu_memory_utilization": str(gmu or 0.9), "num_cpu_blocks": "2048",
                "num_gpu_blocks": str(total_blocks), "swap_space_bytes": "4294967296"}
    if profile == "0.8":
        # 0.8.x emitted this at logger init, before the engine core reported its block count (vllm#15538).
        return {**common, "calculate_kv_scales": "False", "cpu_offload_gb": "0",
                "gpu_memory_utilization": str(gmu or 0.9), "is_attention_free": "False", "num_cpu_blocks": "None",
                "num_gpu_blocks": "None", "swap_space_bytes": "4294967296"}
    if profile == "0.10":
        return {**common, "calculate_kv_scales": "False", "cpu_kvcache_space_bytes": "None", "cpu_offload_gb": "0",
                "engine": str(s.engine), "gpu_memory_utilization": str(gmu or 0.9), "is_attention_free": "False",
                "num_cpu_blocks": "None", "num_gpu_blocks": str(total_blocks), "prefix_caching_hash_algo": "builtin",
                "swap_space": "4", "swap_space_bytes": "4294967296.0"}  # (__post_init__ adds it, to 0.19)
    blocks_per_request = -(-max_model_len // s.block_size)
    concurrency = s.num_gpu_blocks / blocks_per_request
    return {
        **common,
        "_block_size_resolved": "True",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": "None",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "engine": str(s.engine),
        "gpu_memory_utilization": str(gmu or 0.92),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(concurrency),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(int(concurrency * max_model_len)),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(total_blocks),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "simple_cpu_offload_num_blocks": "None",
        "skip_page_size_padded": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
