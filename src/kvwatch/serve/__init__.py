"""The service wing: ``kvwatch serve`` and everything only the running sidecar needs.

``app`` (poll timer, HTTP endpoint, signals), ``state`` (the frozen snapshot each poll swaps in),
``collector`` (turns that snapshot into ``kvwatch_*`` families at scrape time), and the analyzers that
plug the pure core into a poll: ``capacity`` (+ ``sidecar_capacity``, which resolves the model and GPU from
the settings and the engine's ``cache_config_info``) and ``forecast`` (+ ``forecast_export``).
Nothing in the pure core imports from here; see docs/architecture.md.
"""
