"""The service wing: ``kvwatch serve`` and everything only the running sidecar needs.

``app`` (poll timer, signals), ``web`` (the HTTP endpoint: /metrics, /healthz, TLS, basic auth), ``state`` (the
frozen snapshot each poll swaps in), ``collector`` (turns that snapshot into ``kvwatch_*`` families at scrape time),
``logs`` (a bounded queue to stderr), ``gpu`` (the GPU memory watcher: dcgm-exporter or NVML), and the analyzers that
plug the pure core into a poll: ``capacity`` (+ ``sidecar_capacity``, which resolves the model and GPU from
the settings and the engine's ``cache_config_info``), ``forecast`` (+ ``forecast_export``; the advisor runs inside
it) and ``latency``.
Nothing in the pure core imports from here; see docs/architecture.md.
"""
