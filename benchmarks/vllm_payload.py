"""Generate a realistic vLLM 0.33 ``/metrics`` payload (deterministic), for the parser benchmark.

The payload is produced by ``prometheus_client`` itself, as vLLM does, with vLLM 0.33's family names,
labels, help texts and bucket lists (``vllm/v1/metrics/loggers.py`` and ``buckets.py``), for ``engines``
data-parallel engines, every histogram family (including the ``--kv-cache-metrics`` ones) and the
``*_created`` samples single-process mode emits. ``python benchmarks/vllm_payload.py > payload.prom``.
"""

from __future__ import annotations

import random
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
MAX_MODEL_LEN = 32768


def buckets_1_2_5(limit: int) -> list[float]:
    out, base = [], 1
    while True:
        for m in (1, 2, 5):
            if m * base > limit:
                return [float(x) for x in out]
            out.append(m * base)
        base *= 10


LATENCY_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
                160, 640, 2560]
LATENCY_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
LATENCY_E2E = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]
KV_RESIDENCY = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200,
                1800]
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]

HISTOGRAMS: list[tuple[str, str, list[float], float]] = [
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets_1_2_5(MAX_MODEL_LEN), 3000),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", buckets_1_2_5(MAX_MODEL_LEN), 400),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     buckets_1_2_5(MAX_MODEL_LEN), 1024),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
     buckets_1_2_5(MAX_MODEL_LEN), 1024),
    ("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20], 1),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION, 512),
    ("vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).", buckets_1_2_5(MAX_MODEL_LEN),
     2000),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.",
     [1, 2, 3, 4, 5, 10, 20], 1),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", LATENCY_TTFT, 0.4),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", LATENCY_ITL, 0.04),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     LATENCY_ITL, 0.04),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_E2E, 20),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LATENCY_E2E, 1),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     LATENCY_E2E, 19),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", LATENCY_E2E, 0.4),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", LATENCY_E2E, 18),
    ("vllm:kv_block_lifetime_seconds", "Histogram of KV cache block lifetime from allocation to eviction. Sampled "
     "metrics (controlled by --kv-cache-metrics-sample).", KV_RESIDENCY, 30),
    ("vllm:kv_block_idle_before_evict_seconds", "Histogram of idle time before KV cache block eviction. Sampled "
     "metrics (controlled by --kv-cache-metrics-sample).", KV_RESIDENCY, 10),
    ("vllm:kv_block_reuse_gap_seconds", "Histogram of time gaps between consecutive KV cache block accesses. "
     "Sampled metrics (controlled by --kv-cache-metrics-sample).", KV_RESIDENCY, 5),
]

COUNTERS: list[tuple[str, str, list[tuple[str, list[str]]]]] = [
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", []),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", []),
    ("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache "
     "sharing, in terms of number of queried tokens.", []),
    ("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, "
     "in terms of number of cached tokens.", []),
    ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", []),
    ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", []),
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", []),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", []),
    ("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
     [("source", ["local_compute", "local_cache_hit", "external_kv_transfer"])]),
    ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", []),
    ("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them.",
     [("source", ["device", "host", "p2p", "disk", "external_unspecified"])]),
    ("vllm:generation_tokens", "Number of generation tokens processed.", []),
    ("vllm:request_success", "Count of successfully processed requests.",
     [("finished_reason", ["stop", "length", "abort", "error", "repetition"])]),
]


def generate(engines: int = 8, seed: int = 0) -> str:
    rng = random.Random(seed)
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    engine_ids = [str(i) for i in range(engines)]

    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                    registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
                    registry=registry)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason labels: "
                      "'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints "
                      "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
                      "vllm:num_requests_waiting.", [*labels, "reason"], registry=registry)
    sleep = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
                  "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
                  "level 2.", [*labels, "sleep_state"], registry=registry)
    usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels,
                  registry=registry)
    config_labels = ["_block_size_resolved", "block_size", "cache_dtype", "enable_prefix_caching", "engine",
                     "gpu_memory_utilization", "kv_cache_max_concurrency", "kv_cache_memory_bytes",
                     "kv_cache_size_tokens", "num_gpu_blocks", "prefix_caching_hash_algo", "sliding_window",
                     "user_specified_block_size"]
    config = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", config_labels,
                   registry=registry)
    counters = {name: Counter(name, help_text, labels + [k for k, _ in extra], registry=registry)
                for name, help_text, extra in COUNTERS}
    histograms = {name: (Histogram(name, help_text, labels, buckets=buckets, registry=registry), mean)
                  for name, help_text, buckets, mean in HISTOGRAMS}

    for e in engine_ids:
        key = (MODEL, e)
        running.labels(*key).set(rng.randint(0, 64))
        waiting.labels(*key).set(rng.randint(0, 10))
        by_reason.labels(*key, "capacity").set(rng.randint(0, 8))
        by_reason.labels(*key, "deferred").set(rng.randint(0, 2))
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*key, state).set(value)
        usage.labels(*key).set(rng.random())
        config.labels("True", "16", "auto", "True", e, "0.92", "4.85", "None", "158976", str(9936 * engines),
                      "sha256", "None", "None").set(1)
        for name, _, extra in COUNTERS:
            combos: list[list[str]] = [[]]
            for _, values in extra:
                combos = [[*c, v] for c in combos for v in values]
            for combo in combos:
                counters[name].labels(*key, *combo).inc(rng.randint(0, 10**7))
        for histogram, mean in histograms.values():
            child = histogram.labels(*key)
            for _ in range(40):
                child.observe(rng.expovariate(1 / mean))
    return generate_latest(registry).decode()


if __name__ == "__main__":
    sys.stdout.write(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
