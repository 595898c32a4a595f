"""vLLM's histogram buckets (``vllm/v1/metrics/buckets.py`` and ``vllm/engine/metrics.py``).

The engine records observations against the *union* of every bucket bound any supported vLLM version
uses for a family, so one run can be rendered exactly as any version would expose it: every
version's bounds are a subset of the union.
"""

from __future__ import annotations


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value`` inclusive."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


# Current (V1 >= 0.8.5) bounds; older generations use a prefix of these (see metrics.py).
TTFT_SECONDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_SECONDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_SECONDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# SGLang's TokenizerMetricsCollector defaults (python/sglang/srt/metrics/collector.py), recorded beside vLLM's so
# that its page renders its own bounds (kvwatch.sim.engines_wire; TensorRT-LLM's MetricsCollector uses vLLM's).
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
              0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
SGLANG_QUEUE = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500,
                600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)


def union(*bounds: tuple[float, ...]) -> tuple[float, ...]:
    """Every bound of each set, ascending (what one recorded histogram must hold to render each engine's)."""
    return tuple(sorted({float(b) for group in bounds for b in group}))
# V0 and V1 up to 0.8.x used the CUDA-graph capture sizes instead (build_cudagraph_buckets in V1), which
# depend on the engine's limits; see the two functions below (vllm/config.py VllmConfig._set_cudagraph_sizes).
_V0_CAPTURE_CANDIDATES = (1, 2, 4, *range(8, 8 * 1024 + 1, 8))
_V1_CAPTURE_CANDIDATES = (1, 2, 4, *range(8, 513, 8))


def iteration_tokens_v0(max_num_seqs: int) -> tuple[int, ...]:
    """V0: ``[1, 2, 4] + [8 * i for i in range(1, 1025)]`` up to the first size >= ``max_num_seqs``."""
    cap = next((size for size in _V0_CAPTURE_CANDIDATES if size >= max_num_seqs), _V0_CAPTURE_CANDIDATES[-1])
    return tuple(size for size in _V0_CAPTURE_CANDIDATES if size <= cap)


def iteration_tokens_v1_08(max_num_batched_tokens: int) -> tuple[int, ...]:
    """V1 0.8.x: ``[1, 2, 4] + list(range(8, 513, 8))``, dropping sizes above ``max_num_batched_tokens``."""
    return tuple(size for size in _V1_CAPTURE_CANDIDATES if size <= max_num_batched_tokens)


ITERATION_TOKENS_UNION = tuple(sorted({*ITERATION_TOKENS, *_V0_CAPTURE_CANDIDATES, *_V1_CAPTURE_CANDIDATES}))
# V0's model forward/execute time histograms: build_1_2_3_5_8_buckets(3000), in milliseconds.
MODEL_TIME_MS_V0 = (1, 2, 3, 5, 8, 10, 20, 30, 50, 80, 100, 200, 300, 500, 800, 1000, 2000, 3000)
PARAMS_N = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)
# Token-count histograms use 1-2-5 up to max_model_len; record up to 10^8 so any max_model_len renders.
REQUEST_TOKENS = tuple(build_1_2_5_buckets(100_000_000))
