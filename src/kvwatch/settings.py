"""Settings: one name per concept, as a flag and as a ``KVWATCH_*`` variable.

Every field of a settings class is exposed as ``--field-name`` and ``KVWATCH_FIELD_NAME``
(``poll_interval_seconds`` is ``--poll-interval-seconds`` and ``KVWATCH_POLL_INTERVAL_SECONDS``;
Helm's ``config.pollIntervalSeconds``). Flags win over variables, variables over defaults.
A bad value raises :class:`SettingsError` naming the flag or the variable it came from; the CLI
turns that into exit code 2.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import math
import os
import re
import ssl
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args
from urllib.parse import unquote, urlsplit, urlunsplit

from kvwatch.engines import parse_renames

ENV_PREFIX = "KVWATCH_"
MIN_INTERVAL_SECONDS = 0.01
MAX_INTERVAL_SECONDS = 3600.0
# The longest poll step (interval x clock speed) the forecaster works with: it fits minute buckets (15 of them in its
# 45-minute trend window) and takes 2-minute medians for the bottleneck. At 240 s it never left warming_up, and its
# ETA read +Inf with the cache full (docs/forecasting.md, "In the sidecar").
MAX_POLL_STEP_SECONDS = 120.0
MAX_STALE_AFTER_SECONDS = 86400.0
MAX_CLOCK_SPEED = 10000.0
MIN_CLOCK_SPEED = 0.001  # slower, the poll clock stops advancing between polls (its float holds ~1e9 seconds)
MAX_GPU_MEMORY_GIB = 4096.0  # 4 TiB: no accelerator comes near; past it the sums overflow into nonsense
# vLLM's --kv-cache-dtype values (and the model dtypes an "auto" cache takes), as kvwatch accepts them: the
# capacity model sizes the first line's (kvwatch.capacity.units.DTYPE_BYTES) and refuses to plan vLLM 0.33's
# smaller ones, whose scales it does not model (an engine running one still gets every other figure).
KV_CACHE_DTYPES: frozenset[str] = frozenset(
    {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "bfloat16", "float16", "bf16", "fp16",
     "nvfp4", "nvfp4_ds_mla", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
     "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"})

# `name` or `name{label="value",...}`: how users point kvwatch at a renamed source metric. The patterns are
# RE2-compatible: the chart's values.schema.json carries them too (scripts/sync_chart_files.py).
SELECTOR_PATTERN = (r'^\s*[a-zA-Z_:][a-zA-Z0-9_:]*'
                    r'(\{\s*([a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*(,\s*)?)*\})?\s*$')
_SELECTOR = re.compile(SELECTOR_PATTERN)
# Comma-separated GPU UUIDs as nvidia-smi -L prints them (GPU-..., MIG-...); empty entries are skipped.
GPU_UUIDS_PATTERN = r"^[\s,]*(GPU-|MIG-)[^,\s]*(\s*,[\s,]*(GPU-|MIG-)[^,\s]*)*[\s,]*$"  # linear: no nested \s*
_GPU_UUIDS = re.compile(GPU_UUIDS_PATTERN)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that (user, password) pair (None when absent)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host)), (unquote(parts.username or ""), unquote(parts.password or ""))


def redact_url(url: str) -> str:
    """``url`` fit for logs, labels and messages: credentials in it replaced by ``***``.

    Read from the text, not the parsed URL: a password with an unencoded ``?``, ``#`` or ``/`` ends the parsed
    authority early, so the parsed URL has no password while its text holds one. Up to the first ``/`` the text is
    the authority, and everything to its last ``@`` goes (``http://u:p?ss@host``); ``http://u:12/ss@host`` parses
    as host ``u``, port 12, so an ``@`` in the first path segment goes too. An ``@`` later in a path or in a query
    (``/users/me@x``) is no credential and stays. The query's values go too (``?token=***``): a proxy's token is
    often passed there. Text that is no URL (``u:pw@host/metrics``, ``http:/u:pw@host``), as a refused value is
    quoted, loses everything before the first ``@``'s authority."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _redact_query(_redact_unparsed(url))
    slash = rest.find("/")
    at = rest.rfind("@", 0, len(rest) if slash == -1 else slash)
    if at == -1 and slash != -1:
        segment = re.split(r"[/?#]", rest[slash + 1:], maxsplit=1)[0]
        at = rest.rfind("@", slash + 1, slash + 1 + len(segment))
    return _redact_query(url if at == -1 else f"{scheme}://***@{rest[at + 1:]}")


def _redact_unparsed(text: str) -> str:
    """:func:`redact_url` of a text without ``://``: a scheme and slashes kept, the rest to the last ``@`` before the
    first slash after the first ``@`` masked."""
    first = text.find("@")
    if first == -1:
        return text
    end = re.search(r"[/\\]", text[first:])
    at = text.rfind("@", 0, first + end.start() if end else len(text))
    kept = re.match(r"([A-Za-z][A-Za-z0-9+.-]*:(?=[/\\]))?[/\\]*", text)
    start = kept.end() if kept else 0
    return text if at < start else f"{text[:start]}***@{text[at + 1:]}"


def _redact_query(url: str) -> str:
    head, sep, query = url.partition("?")
    if not sep:
        return url
    query, hash_sep, fragment = query.partition("#")
    return head + sep + re.sub(r"=[^&;]*", "=***", query) + hash_sep + fragment


# A bad variable beside the flag that overrides it (load_settings); `kvwatch check` names its URL argument in it.
REFUSED_BESIDE = "refused though {flag} is given too"


def check_listen_address(v: str) -> str:
    """An address to listen on (serve's and simulate's), or ValueError saying what it must be."""
    try:
        ipaddress.ip_address(v)  # IPv4 or IPv6 ("::" listens on both where the system allows)
    except ValueError:
        if not re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", v):
            raise ValueError("must be an IP address (0.0.0.0, ::, 127.0.0.1) or a host name") from None
    return v


def check_url(v: str) -> str:
    """An http(s) URL with a host, or ValueError saying what is wrong."""
    if any(c.isspace() or not c.isprintable() for c in v):
        raise ValueError("must be a URL without spaces or control characters")
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        if "@" in v:  # the error quotes the text it took for the port: part of a password, maybe
            raise ValueError("must be an http:// or https:// URL with a numeric port (in a user name or password, "
                             "percent-encode '/', '#', '?' and '@')") from None
        raise ValueError(f"must be an http:// or https:// URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if urlsplit(redact_url(v)).hostname != parts.hostname:
        # http://u:12/ss@host parses as host u, port 12: every poll went to u with a password's end in its path,
        # while the logs (redact_url hides all to that @, as a password) named host. The text cannot tell that from
        # an '@' in a first path segment or a query right after the host (vllm:8000/@team): both are refused, and
        # the message says how to write either.
        raise ValueError(f"reads as host {parts.hostname!r} with an '@' after it, which the logs would take for the "
                         "end of a password: in a user name or password, percent-encode '/', '#', '?' and '@'; in "
                         "a path or query, write '@' as %40")
    if parts.port == 0:  # no server listens on port 0: every poll would fail with "connect"
        raise ValueError("port 0 is no port a server listens on")
    if not re.fullmatch(r"[A-Za-z0-9._:%-]+", parts.hostname):
        # e.g. "$(NODE_IP)" left as is: Kubernetes expands $(VAR) only for variables defined earlier.
        raise ValueError(f"host {parts.hostname!r} is not a host name or an IP address (an unexpanded "
                         "$(VARIABLE)?)")
    return v


def path_argument(text: str) -> Path:
    """argparse's ``type`` for a path flag: an empty one is refused (Path("") is ".", and "--trace ''" was reported
    as "--trace .: a directory")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("should not be empty")
    return Path(text)


def png_output_path(path: Path) -> Path:
    """A ``--plot`` PNG path, refused up front (exit 2) rather than after the work it plots: a directory, another
    suffix, a missing directory, or matplotlib (the plot extra) not installed."""
    if path.is_dir():
        raise SettingsError(f"invalid value for --plot: {path} is a directory; name the PNG file")
    if path.suffix.lower() != ".png":
        raise SettingsError(f"invalid value for --plot: {path} must end in .png (the plot is a PNG)")
    if not path.parent.is_dir():
        raise SettingsError(f"invalid value for --plot: directory {path.parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SettingsError("--plot needs matplotlib: pip install 'kvwatch[plot]'") from None
    return path


def _regular_file(v: Path | None) -> Path | None:
    """``v`` if it is a regular file: a device (/dev/zero), FIFO or folder is named as such, not as missing."""
    if v is None:
        return v
    try:
        if not v.is_file():
            raise ValueError(f"file {v} does not exist" if not v.exists() else f"{v} is not a regular file")
    except OSError as exc:  # a folder on the way this user may not enter
        raise ValueError(f"cannot read {v}: {exc.strerror or exc}") from None
    return v


def _json_object(path: Path) -> None:
    """Raise ValueError unless ``path`` holds one JSON object (a config.json): what vLLM would refuse to load."""
    from kvwatch.capacity.architecture import ArchitectureError
    from kvwatch.capacity.presets import read_config_json

    try:
        data = read_config_json(path)
    except ArchitectureError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds JSON but not an object (a config.json is one)")


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)


class SettingsError(ValueError):
    """A setting has a bad value; ``str()`` is a one-line message naming the flag or variable. ``sources_named``:
    the message says already where each value came from (:func:`name_variables` is not to run on it again)."""

    sources_named = False


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


# ---------------------------------------------------------------- the settings model

# The settings layer is plain Python, not pydantic: pydantic, pydantic_settings and the modules they pull in
# (importlib.metadata, email, zipfile...) cost the sidecar ~11 MB of RSS (docs/performance.md). What kvwatch
# used of it is here: typed fields with bounds, lax parsing of flag and variable strings with pydantic's rules
# and messages, field and model validators, the fields given (``model_fields_set``) and ``model_copy``.

class FieldInfo:
    """One setting: its type (from the class annotation), default, help text and numeric bounds."""

    __slots__ = ("annotation", "default", "description", "ge", "gt", "le")

    def __init__(self, default: Any, description: str, gt: float | None, ge: float | None,
                 le: float | None) -> None:
        self.annotation: Any = None  # filled in from the class annotation
        self.default = default
        self.description = description
        self.gt, self.ge, self.le = gt, ge, le


def Field(default: Any, *, description: str, gt: float | None = None, ge: float | None = None,
          le: float | None = None) -> Any:
    """A setting's declaration (typed Any so that ``port: int = Field(...)`` type-checks)."""
    return FieldInfo(default, description, gt, ge, le)


def field_validator(*fields: str, mode: Literal["before", "after"] = "after") -> Callable[[Any], Any]:
    """Marks a classmethod ``(cls, value) -> value`` that checks (after) or prepares (before) these fields."""
    def mark(method: Any) -> Any:
        method.__func__._validates = (fields, mode)
        return method
    return mark


class _Invalid(ValueError):
    """A field's value is bad: which field, the value as it was checked, and why."""

    def __init__(self, field: str, message: str, value: Any) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.value = field, message, value


_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_TRUE, _FALSE = frozenset({"1", "on", "t", "true", "y", "yes"}), frozenset({"0", "off", "f", "false", "n", "no"})
_NOT_INT, _NOT_NUMBER = "Input should be a valid integer", "Input should be a valid number"


def _to_int(v: Any) -> int:
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("Input should be a finite number")
        if not v.is_integer():
            raise ValueError(f"{_NOT_INT}, got a number with a fractional part")
        return int(v)
    if isinstance(v, str) and v.isascii() and _INT_TEXT.fullmatch(v.strip()):
        return int(v.strip().partition(".")[0])
    raise ValueError(f"{_NOT_INT}, unable to parse string as an integer" if isinstance(v, str) else _NOT_INT)


def _to_float(v: Any) -> float:
    if isinstance(v, bool | int | float):
        number = float(v)
    elif isinstance(v, str) and v.isascii():
        try:
            number = float(v)  # ASCII only: Python would read Arabic-Indic digits too, pydantic did not
        except ValueError:
            raise ValueError(f"{_NOT_NUMBER}, unable to parse string as a number") from None
    else:
        raise ValueError(f"{_NOT_NUMBER}, unable to parse string as a number" if isinstance(v, str) else _NOT_NUMBER)
    if not math.isfinite(number):  # "inf" parses as a float; no setting means anything infinite
        raise ValueError("Input should be a finite number")
    return number


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in _TRUE | _FALSE:
        return v.lower() in _TRUE
    raise ValueError("Input should be a valid boolean, unable to interpret input")


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise ValueError("Input should be a valid string")


def _to_path(v: Any) -> Path:
    if isinstance(v, str | Path):
        return Path(v)
    raise ValueError("Input is not a valid path")


_CONVERTERS: dict[Any, Callable[[Any], Any]] = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str,
                                               Path: _to_path}


def _bound(b: float) -> str:
    return str(int(b)) if isinstance(b, float) and b.is_integer() else str(b)


class _Base:
    """Typed settings: ``Cls(**values)`` converts and checks every field (defaults too), in declaration order."""

    model_fields: ClassVar[dict[str, FieldInfo]] = {}
    _validators: ClassVar[dict[str, list[tuple[str, Callable[[Any], Any]]]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hints = typing.get_type_hints(cls)
        fields = dict(cls.model_fields)  # a redeclared field keeps its place, as in pydantic
        for name, value in list(vars(cls).items()):
            if isinstance(value, FieldInfo):
                value.annotation = hints[name]
                fields[name] = value
                delattr(cls, name)
        cls.model_fields = fields
        validators = {name: list(checks) for name, checks in cls._validators.items()}
        for attr in vars(cls).values():
            marks = getattr(getattr(attr, "__func__", None), "_validates", None)
            if marks:
                for name in marks[0]:
                    validators.setdefault(name, []).append((marks[1], getattr(cls, attr.__func__.__name__)))
        cls._validators = validators

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self.model_fields)
        if unknown:
            name = sorted(unknown)[0]
            raise _Invalid(name, "Extra inputs are not permitted", values[name])
        for name, info in self.model_fields.items():
            object.__setattr__(self, name, self._convert(name, info, values.get(name, info.default)))
        object.__setattr__(self, "model_fields_set", set(values))
        self._after()

    @classmethod
    def _convert(cls, name: str, info: FieldInfo, value: Any) -> Any:
        checks = cls._validators.get(name, [])
        given = value  # what a message shows: the input (after "before" validators), as pydantic did
        try:
            for mode, check in checks:
                if mode == "before":
                    given = value = check(value)
            args = typing.get_args(info.annotation)
            if value is None and type(None) in args:
                return None
            kind = next((a for a in args if a is not type(None)), info.annotation) if args else info.annotation
            if typing.get_origin(info.annotation) is Literal:
                if value not in args:
                    choices = [repr(a) for a in args]
                    raise ValueError(f"Input should be {', '.join(choices[:-1])} or {choices[-1]}")
            else:
                if kind in (str, Path) and isinstance(value, str) and not value.strip():
                    # (a flag typed empty: --model '' was taken as a model named "", and an empty path read as ".")
                    raise ValueError("Input should not be empty")
                value = _CONVERTERS[kind](value)
            if info.gt is not None and not value > info.gt:
                raise ValueError(f"Input should be greater than {_bound(info.gt)}")
            if info.ge is not None and not value >= info.ge:
                raise ValueError(f"Input should be greater than or equal to {_bound(info.ge)}")
            if info.le is not None and not value <= info.le:
                raise ValueError(f"Input should be less than or equal to {_bound(info.le)}")
            for mode, check in checks:
                if mode == "after":
                    value = check(value)
        except ValueError as exc:
            raise _Invalid(name, str(exc), given) from None
        return value

    def _after(self) -> None:
        """Cross-field checks and derived defaults, once every field is valid (subclasses extend it)."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in self.model_fields:
            self.model_fields_set.add(name)  # as pydantic: a field assigned counts as given

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Any:
        """A copy with ``update`` applied as is (not checked), those fields counted as given."""
        new = copy.copy(self)
        object.__setattr__(new, "model_fields_set", self.model_fields_set | set(update or {}))
        for name, value in (update or {}).items():
            object.__setattr__(new, name, value)
        return new

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.model_fields)

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic models are

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.model_fields)})"

    @classmethod
    def json_schema(cls) -> dict[str, dict[str, Any]]:
        """Each field as JSON schema (``type``, bounds, ``enum``; ``anyOf`` with null when it may be unset)."""
        json_types = {int: "integer", float: "number", bool: "boolean", str: "string", Path: "string"}
        properties: dict[str, dict[str, Any]] = {}
        for name, info in cls.model_fields.items():
            args = typing.get_args(info.annotation)
            branch: dict[str, Any]
            if typing.get_origin(info.annotation) is Literal:
                branch = {"enum": list(args), "type": "string"}
            else:
                kind = next((a for a in args if a is not type(None)), info.annotation) if args else info.annotation
                branch = {"type": json_types[kind], **({"format": "path"} if kind is Path else {})}
            for key, bound in (("exclusiveMinimum", info.gt), ("minimum", info.ge), ("maximum", info.le)):
                if bound is not None:
                    branch[key] = bound
            spec = {"anyOf": [branch, {"type": "null"}]} if type(None) in args else branch
            properties[name] = {**spec, "default": info.default, "description": info.description}
        return properties


class DeploymentSettings(_Base):
    """What the model and the card are: feeds the capacity model (``plan`` and ``serve``)."""

    model: str | None = Field(
        None, description="Model preset name (a Hugging Face id, e.g. meta-llama/Llama-3.1-8B-Instruct), or a local "
                          "model folder with a config.json."
    )
    model_config_path: Path | None = Field(
        None, description="Path to the model's Hugging Face config.json (or the folder holding it)."
    )
    gpu: str | None = Field(None, description="GPU preset name (H100, A100-80GB, L4, ...).")
    gpu_memory_gib: float | None = Field(None, gt=0, le=MAX_GPU_MEMORY_GIB,
                                         description="GPU memory vLLM sees, in GiB (instead of --gpu).")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM --gpu-memory-utilization (default: vLLM's, 0.92 in current versions)."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=1024, description="vLLM --tensor-parallel-size.")
    gpus_per_node: int = Field(8, ge=1, le=1024, description="GPUs in one node: the largest tensor-parallel size "
                               "kvwatch proposes (plan's inverse planner, the advice of check and serve); beyond "
                               "it, a replica.")
    pipeline_parallel_size: int = Field(1, ge=1, le=1024, description="vLLM --pipeline-parallel-size.")
    dtype: str = Field("auto", description="vLLM --dtype: auto, bfloat16, float16, float32 (bf16, fp16, fp32).")
    kv_cache_dtype: str = Field(
        "auto", description="vLLM --kv-cache-dtype: auto, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla, bfloat16, "
        "float16 (bf16, fp16); vLLM 0.33's nvfp4, *_per_token_head and turboquant_* are taken but not sized (no "
        "capacity plan)."
    )
    quantization: str | None = Field(
        None, description="Weight quantization: fp8, int8, w8a8, int4, awq, gptq, mxfp4, nvfp4, ..."
    )
    block_size: int = Field(16, ge=1, description="vLLM --block-size (tokens per KV block): 1, 8, 16, 32, 64, 128 or "
                            "256.")
    max_model_len: int | None = Field(None, ge=1, description="vLLM --max-model-len.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="vLLM --max-num-batched-tokens.")
    max_num_seqs: int | None = Field(None, ge=1, description="vLLM --max-num-seqs.")

    @field_validator("block_size")
    @classmethod
    def _block_size(cls, v: int) -> int:
        from kvwatch.capacity.kv import VLLM_BLOCK_SIZES  # (the one list, the planner's)

        if v not in VLLM_BLOCK_SIZES:
            raise ValueError(f"vLLM accepts {', '.join(map(str, VLLM_BLOCK_SIZES))}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        allowed = {"auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "half", "float"}
        if v.lower() not in allowed:
            raise ValueError(f"must be one of {', '.join(sorted(allowed))}")
        return v.lower()

    # A misspelt card stops every command here (plan refused it; serve and check used to run on without a
    # capacity plan, with one line in the log). The model is checked by check (kvwatch.check) and plan only:
    # serve's is also the model vLLM serves (the Helm chart passes one value to both), and a model kvwatch has
    # no preset for must cost the capacity model, not the sidecar.
    @field_validator("gpu")
    @classmethod
    def _gpu_preset(cls, v: str | None) -> str | None:
        from kvwatch.capacity import presets

        if v is not None:
            try:
                presets.resolve_gpu(v)
            except presets.PresetError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("model_config_path")
    @classmethod
    def _config_exists(cls, v: Path | None) -> Path | None:
        if v is not None and not (v.is_file() or (v / "config.json").is_file()):
            raise ValueError(f"{v} is neither a file nor a folder with a config.json")
        if v is not None:  # read now: a file that is no JSON object is a bad flag, not a warning at the first poll
            _json_object(v)
        return v

    @field_validator("quantization")
    @classmethod
    def _quantization(cls, v: str | None) -> str | None:
        # A typo is a bad flag in every command, as a misspelt --gpu is: serve and check logged it at INFO and ran
        # without the capacity model, plan refused it. A method vLLM takes that kvwatch cannot price (gguf, ...) is
        # no typo: the capacity model is off for it, with a warning.
        from kvwatch.capacity.quantization import QuantizationError, check_name

        try:
            check_name(v, vllm_methods=True)
        except QuantizationError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, v: str) -> str:
        if v.lower() not in KV_CACHE_DTYPES:
            raise ValueError(f"must be one of {', '.join(sorted(KV_CACHE_DTYPES))}")
        return v.lower()


# Public names that differ from the field name (the field was named when pydantic reserved `model_config`).
PUBLIC_NAMES: dict[str, str] = {"model_config_path": "model_config"}


def public_name(field: str) -> str:
    return PUBLIC_NAMES.get(field, field)


class TargetSettings(DeploymentSettings):
    """What one poll of vLLM needs: where, how long at most, and how to read it (``serve`` and ``check``)."""

    target_url: str = Field("http://127.0.0.1:8000/metrics", description="vLLM /metrics URL to poll.")
    poll_timeout_seconds: float | None = Field(
        None, gt=0, description="Timeout of one poll; must be below the interval (default 0.8 x interval)."
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, le=1024**3,
        description="Largest /metrics body read, at most 1 GiB (the memory guard); larger is an error, and so is "
                    "one whose text takes more than twice this in memory (characters beyond Latin-1). A body at the "
                    "cap peaks at about twice this plus the ~36 MB the sidecar idles at (its bytes and its text), up "
                    "to five times with characters beyond Latin-1 or undecodable bytes in comments (a text twice as "
                    "wide, widened as it is decoded): keep it under a fifth of the memory limit."
    )
    usage_metric: str | None = Field(None, description='Override the KV usage source: name or name{label="value"}.')
    running_metric: str | None = Field(None, description="Override the running-requests source metric.")
    waiting_metric: str | None = Field(None, description="Override the waiting-requests source metric.")
    rename_metrics: str | None = Field(
        None, description="Read a family of the page under the engine's name (any family kvwatch reads, the three "
                          "gauges above included): PAGE_NAME=ENGINE_NAME pairs separated by commas "
                          "(proxy_preemptions_total=vllm:num_preemptions_total).")
    bearer_token_file: Path | None = Field(None, description="File holding a bearer token sent to the target.")
    ca_file: Path | None = Field(None, description="CA bundle to verify the target's TLS certificate (an https "
                                 "target only; not with --tls-verify false).")
    tls_verify: bool = Field(True, description="Verify the target's TLS certificate (false to skip; an https target "
                             "only).")

    @field_validator("usage_metric", "running_metric", "waiting_metric")
    @classmethod
    def _selector(cls, v: str | None) -> str | None:
        if v is not None and not _SELECTOR.match(v):
            raise ValueError('must be a metric name or name{label="value"}')
        return v.strip() if v else v

    @field_validator("rename_metrics")
    @classmethod
    def _renames(cls, v: str | None) -> str | None:
        parse_renames(v)  # (raises ValueError naming what is wrong; what no page can make right: _after)
        return v.strip() if v else None

    @field_validator("target_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, v: Path | None) -> Path | None:
        return _regular_file(v)

    @field_validator("bearer_token_file")
    @classmethod
    def _token_readable(cls, v: Path | None) -> Path | None:
        # Not quoted: a token given where its file's path belongs (KVWATCH_BEARER_TOKEN_FILE=eyJ...) went to the log.
        if v is not None:
            try:  # read now: one that cannot be read failed every poll instead (it is read again on each, to rotate)
                if not v.exists():
                    raise ValueError("no such file (a token given in place of its file's path?)")
                if not v.is_file():
                    raise ValueError("the path is not a regular file")
                with v.open("rb"):
                    pass
            except OSError as exc:  # (a folder on the way this user may not enter, a mode-000 file)
                raise ValueError(f"cannot read the file: {exc.strerror or exc}") from None
        return v

    @field_validator("ca_file")
    @classmethod
    def _ca_bundle(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:  # load it now: a bad bundle is a config error at startup, not a traceback
                ssl.create_default_context(cafile=str(v))
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"not a PEM CA bundle: {exc}") from None
        return v

    def _after(self) -> None:
        # Flags that contradict each other or do nothing stop startup, as a flag of a wrong value does.
        self._check_renames()
        if self.ca_file is not None and not self.tls_verify:
            raise _FieldError("ca_file", "cannot be used with {tls_verify} false: a bundle to verify the target "
                              "with, and no verification")
        if (self.ca_file is not None or not self.tls_verify) and not self.target_url.lower().startswith("https:"):
            field = "ca_file" if self.ca_file is not None else "tls_verify"
            raise _FieldError(field, "applies to an https:// target only; {target_url} is plain http")
        if self.bearer_token_file is not None and split_credentials(self.target_url)[1] is not None:
            # Both set an Authorization header: the URL's basic auth replaced the token, unsaid (Prometheus refuses
            # a scrape config with both).
            raise _FieldError("bearer_token_file", "cannot be used with credentials in {target_url} (user:password@): "
                              "pick one")

    def _check_renames(self) -> None:
        """A --rename-metrics pair that names no metric kvwatch reads, whatever the page (kvwatch.engines.detect.
        refused_rename), against what it reads with this poll's overrides: a payload-free typo was an unreadable
        target (exit 3) and serve started; a rename to an --usage-metric's name was refused before the overrides
        counted."""
        from kvwatch.engines import Selector
        from kvwatch.engines.detect import refused_rename, wanted_for

        renames = parse_renames(self.rename_metrics)
        overrides = {Selector.parse(v).name for v in (self.usage_metric, self.running_metric, self.waiting_metric)
                     if v}
        read = wanted_for(latency=True, lengths=True) | overrides
        for page, engine in renames.items():
            if (why := refused_rename(page, engine, read)) is not None:
                # (one pair: the value quoted before the message names it already)
                raise _FieldError("rename_metrics", why.removeprefix(
                    f"--rename-metrics {page}={engine}: " if len(renames) == 1 else "--rename-metrics "))

    # 64: a vLLM pod exports 1-8 series (one model name, one engine per data-parallel rank on the node), so
    # 8x headroom. Each series kept costs memory (history, forecaster, capacity state), and the cap is what
    # bounds a label explosion: at 1000 it peaked at ~76 MB, over the 64 MB budget (docs/reliability.md). check
    # reads no more either: a page of 273,000 model names ran for over 10 minutes.
    max_series: int = Field(
        64, ge=1, le=10_000,
        description="Most (model_name, engine) series kvwatch reads from a page (a vLLM pod has 1-8); a target "
        "serving more has the rest dropped (serve counts them in kvwatch_series_dropped_total, one warning; "
        "check says how many). Each series kept costs ~0.9 MB of memory once its forecaster holds two hours of "
        "polls (docs/performance.md); at most 10000."
    )


class CheckSettings(TargetSettings):
    """``kvwatch check``: one poll, so no interval, port or log level to validate."""

    poll_timeout_seconds: float = Field(5.0, gt=0, le=MAX_INTERVAL_SECONDS,
                                        description="Timeout of the one poll (connect, headers and body).")


class ServeSettings(TargetSettings):
    """The sidecar: where to read vLLM, where to serve, how often."""

    listen_address: str = Field(
        "127.0.0.1", description="Address kvwatch serves /metrics on (the container image sets 0.0.0.0)."
    )
    port: int = Field(9747, ge=0, le=65535, description="Port kvwatch serves /metrics and /healthz on (0: a free "
                      "port, logged at start).")
    poll_interval_seconds: float = Field(
        5.0, ge=MIN_INTERVAL_SECONDS, le=MAX_POLL_STEP_SECONDS,
        description="How often kvwatch polls vLLM (its own timer), 0.01 s to 2 min (the forecaster's minute "
        "buckets and 2-minute medians need a poll at least that often)."
    )
    stale_after_seconds: float | None = Field(
        None, gt=0, le=MAX_STALE_AFTER_SECONDS,
        description="Derived gauges vanish when the last good poll is older: at least the interval, "
        "at most a day (default 3 x interval)."
    )
    web_config_file: Path | None = Field(
        None, description="Prometheus exporter-toolkit web config (the YAML node_exporter's --web.config.file "
        "reads): TLS and bcrypt basic auth for kvwatch's own endpoint; re-read when it changes."
    )
    log_level: LogLevel = Field("INFO", description="Log level.")
    ttft_slo_seconds: float | None = Field(
        None, gt=0, le=3600,
        description="Time-to-first-token objective: kvwatch_ttft_slo_breach says when the p90 over the last "
        "5 minutes exceeds it, and whether the KV cache is the cause (unset: no SLO gauge)."
    )
    dcgm_url: str | None = Field(
        None, description="NVIDIA dcgm-exporter /metrics URL (the node's, port 9400), polled on the same timer "
        "for framebuffer memory and Xid errors of the engine's GPUs (unset: off)."
    )
    gpu_pod: str | None = Field(
        None, description="Pod whose GPUs are the engine's, as dcgm-exporter's pod mapping labels them "
        "(the chart sets it to its own pod in sidecar mode)."
    )
    gpu_namespace: str | None = Field(None, description="Namespace of --gpu-pod (unset: any namespace).")
    gpu_uuids: str | None = Field(
        None, description="Comma-separated GPU UUIDs (GPU-...) that are the engine's; wins over --gpu-pod."
    )
    nvml: bool = Field(
        False, description="Read the engine's GPUs through NVML (needs kvwatch[nvml] and the GPUs visible to "
        "kvwatch; all visible GPUs unless --gpu-uuids), instead of --dcgm-url."
    )
    clock_speed: float = Field(
        1.0, ge=MIN_CLOCK_SPEED, le=MAX_CLOCK_SPEED,
        description="Demo/test knob: kvwatch's clock runs this many times real time, to watch a "
        "simulator running --clock-speed times faster (rates are then per simulated second; intervals stay real "
        "seconds). 0.001 to 10000; leave 1 in production."
    )

    @field_validator("listen_address")
    @classmethod
    def _listen_address(cls, v: str) -> str:
        return check_listen_address(v)

    @field_validator("web_config_file")
    @classmethod
    def _web_config(cls, v: Path | None) -> Path | None:
        if v is not None:
            _regular_file(v)  # (a FIFO would hang the start, before SIGTERM is handled)
            from kvwatch.serve.web import WebConfigError, load_web_config

            try:  # load it now: a bad file is a config error at startup (exit 2), not a traceback
                load_web_config(v)
            except WebConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        if isinstance(v, str) and v.upper() not in LOG_LEVELS:  # (refused here, so the message quotes what was given)
            raise ValueError(f"one of {', '.join(LOG_LEVELS)} (any case)")
        return v.upper() if isinstance(v, str) else v

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url(cls, v: str | None) -> str | None:
        return check_url(v) if v is not None else v

    @field_validator("gpu_uuids")
    @classmethod
    def _uuids(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _GPU_UUIDS.match(v):
            raise ValueError("must be comma-separated GPU UUIDs as nvidia-smi -L prints them (GPU-...)")
        return ",".join(u.strip() for u in v.split(",") if u.strip())

    def _after(self) -> None:
        super()._after()
        if self.dcgm_url is not None and self.nvml:
            raise _FieldError("nvml", "cannot be used with {dcgm_url}: pick one GPU source")
        if self.dcgm_url is not None and not (self.gpu_pod or self.gpu_uuids):
            # dcgm-exporter lists every GPU of the node: without a key, which are the engine's is unknown.
            raise _FieldError("dcgm_url", "needs --gpu-pod (KVWATCH_GPU_POD) or --gpu-uuids (KVWATCH_GPU_UUIDS) "
                              "to tell the engine's GPUs from the node's others")
        if self.gpu_uuids and self.dcgm_url is None and not self.nvml:
            raise _FieldError("gpu_uuids", "needs a GPU source: --dcgm-url (KVWATCH_DCGM_URL) or --nvml (KVWATCH_NVML)")
        for field in ("gpu_pod", "gpu_namespace"):  # dcgm-exporter's pod mapping: nothing else reads them
            if getattr(self, field) and self.dcgm_url is None:
                raise _FieldError(field, "needs --dcgm-url (KVWATCH_DCGM_URL): only dcgm-exporter labels GPUs with "
                                  "their pod")
        interval = self.poll_interval_seconds
        if interval * self.clock_speed > MAX_POLL_STEP_SECONDS:
            raise _FieldError("poll_interval_seconds", f"times {{clock_speed}} ({self.clock_speed:g}) is "
                              f"{interval * self.clock_speed:g} s of the poll clock: at most "
                              f"{MAX_POLL_STEP_SECONDS:g} (the forecaster's minute buckets and 2-minute medians)")
        if self.poll_timeout_seconds is None:
            self.poll_timeout_seconds = 0.8 * interval
        elif self.poll_timeout_seconds >= interval:
            raise _FieldError("poll_timeout_seconds", f"must be below {{poll_interval_seconds}} ({interval:g})")
        if self.stale_after_seconds is None:
            self.stale_after_seconds = 3 * interval
        elif self.stale_after_seconds < interval:
            # Staler than one interval between polls would blank the gauges between two good polls.
            raise _FieldError("stale_after_seconds", f"must be at least {{poll_interval_seconds}} ({interval:g})")


class _FieldError(ValueError):
    """A cross-field check that blames one field; ``{other_field}`` in the message names that field's source."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---------------------------------------------------------------- flags <-> settings

def add_settings_flags(parser: argparse.ArgumentParser | Any, settings_cls: type[_Base],
                       only: set[str] | None = None) -> None:
    """Add one ``--flag`` per settings field (all default to "not given")."""
    for name, info in settings_cls.model_fields.items():
        if only is not None and name not in only:
            continue
        pub = public_name(name)
        help_text = f"{info.description or ''}{_default_text(info.default)} [env {env_name(pub)}]"
        if info.annotation is bool:
            parser.add_argument(flag_name(pub), dest=name, nargs="?", const="true", default=None,
                                metavar="BOOL", help=help_text)
        else:
            parser.add_argument(flag_name(pub), dest=name, default=None, metavar=_metavar(info.annotation),
                                help=help_text)


def _default_text(default: Any) -> str:
    """`` (default: 9747)`` for --help; nothing for an unset default (the description says what applies)."""
    if default is None:
        return ""
    if isinstance(default, bool):
        shown = str(default).lower()
    elif isinstance(default, int) and default >= 1 << 20 and default % (1 << 20) == 0:
        shown = f"{default} = {default >> 20} MiB"
    elif isinstance(default, float):
        shown = f"{default:g}"
    else:
        shown = str(default)
    return f" (default: {shown.replace('%', '%%')})"  # argparse %-formats help texts


def _metavar(annotation: Any) -> str:
    text = str(annotation)
    if "int" in text:
        return "N"
    if "float" in text:
        return "X"
    if "Path" in text:
        return "PATH"
    return "VALUE"


def load_settings(settings_cls: type[_Base], args: argparse.Namespace | None = None) -> Any:
    """Build settings from parsed flags (winning) and ``os.environ``; raise SettingsError."""
    flags: dict[str, Any] = {}
    if args is not None:
        flags = {n: getattr(args, n) for n in settings_cls.model_fields if getattr(args, n, None) is not None}
    # Variable names are matched case-insensitively (kvwatch_port is KVWATCH_PORT), typos and doubles alike; a
    # field's variable is named after its public name (KVWATCH_MODEL_CONFIG for model_config_path).
    environ: dict[str, str] = {}
    for key, upper, value in _setting_variables():
        if upper not in KNOWN_ENV:
            flag = "--" + upper[len(ENV_PREFIX):].lower().replace("_", "-")
            raise SettingsError(f"unknown variable {key}: no setting has it ({flag} is no setting of serve or check; "
                                "each setting's variable is shown as [env KVWATCH_...] in their --help, and "
                                "command options such as plan's have none)")
        if upper in environ:
            raise SettingsError(f"variable {upper} is set twice, in two spellings (names are matched whatever "
                                "their case): keep one")
        environ[upper] = value
    values = dict(flags)
    for name, info in settings_cls.model_fields.items():
        variable = env_name(public_name(name))
        if name not in values and variable in environ and (environ[variable] or info.default is not None):
            # An empty variable of a setting that may be unset is unset (a compose file's ${GPU} with GPU unset; the
            # chart leaves out empty keys), as an empty KVWATCH_MODEL_CONFIG always was: KVWATCH_MODEL= was taken
            # as a model named "", KVWATCH_GPU= refused. One with a default is refused: KVWATCH_TARGET_URL= from a
            # broken template must not poll the default target.
            values[name] = environ[variable]
        elif name in flags and environ.get(variable):
            # the flag wins, but a bad variable beside it is refused too: it would take over once the flag is dropped
            try:
                settings_cls._convert(name, info, environ[variable])
            except _Invalid as exc:
                raise SettingsError(_blame(name, {}, f"{exc.message} ("
                                                     f"{REFUSED_BESIDE.format(flag=flag_name(public_name(name)))})",
                                           exc.value)) from None
    try:
        return settings_cls(**values)
    except _Invalid as exc:
        raise SettingsError(_blame(exc.field, flags, exc.message, exc.value)) from None
    except _FieldError as exc:
        msg = str(exc).format(**{f: _source(f, flags) for f in settings_cls.model_fields})
        if exc.field in flags and settings_cls.model_fields[exc.field].annotation is bool:
            # a switch typed on the command line (--nvml) has no value to quote
            raise SettingsError(f"{flag_name(public_name(exc.field))} {msg}") from None
        value = values.get(exc.field, os.environ.get(env_name(public_name(exc.field))))
        raise SettingsError(_blame(exc.field, flags, msg, value)) from None


# Kubernetes gives every pod docker-link variables for each Service in its namespace (unless the pod sets
# enableServiceLinks: false): a Service named kvwatch (`helm install kvwatch`) brings KVWATCH_SERVICE_HOST,
# KVWATCH_SERVICE_PORT, KVWATCH_PORT=tcp://10.0.0.1:9747 and KVWATCH_PORT_9747_TCP_*, which stopped kvwatch as
# unknown or invalid settings. They are no settings of kvwatch's.
# A Service named kvwatch-llama (a release whose name holds "kvwatch") brings KVWATCH_LLAMA_SERVICE_HOST and the like.
_SERVICE_LINK = re.compile(
    rf"{ENV_PREFIX}(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)")
_SERVICE_PORT = re.compile(rf"{ENV_PREFIX}(\w+_)?PORT")


def _setting_variables() -> list[tuple[str, str, str]]:
    """The environment's KVWATCH_* variables as (name, upper-case name, value), Kubernetes' service links left out:
    what load_settings reads, and what messages may say a value came from."""
    # Blanks around a value are no part of it (a template's or a YAML block's): " info " was refused where " 2 " was
    # read.
    return [(key, key.upper(), value.strip()) for key, value in os.environ.items()
            if key.upper().startswith(ENV_PREFIX) and not _service_link(key.upper(), value.strip())]


def _service_link(name: str, value: str) -> bool:
    """Whether an environment variable is one of Kubernetes' service links, not a kvwatch setting."""
    if _SERVICE_LINK.fullmatch(name) and name not in KNOWN_ENV:
        return True
    # <NAME>_PORT=tcp://10.0.0.1:9747; KVWATCH_PORT is a setting too, so the value tells them apart
    return _SERVICE_PORT.fullmatch(name) is not None and re.match(r"(tcp|udp|sctp)://", value) is not None


def _source(field: str, flags: dict[str, Any]) -> str:
    """Where a field's value came from, as the user would write it: the flag, the variable, or the default."""
    pub = public_name(field)
    if field in flags:
        return flag_name(pub)
    if env_name(pub) in {upper for _, upper, _ in _setting_variables()}:
        return env_name(pub)
    return f"the default {flag_name(pub)}"


_UNQUOTED = frozenset({"bearer_token_file"})  # a refused value may be the secret itself, not its path


def _blame(field: str, flags: dict[str, Any], msg: str, value: Any = None) -> str:
    pub = public_name(field)
    source = _source(field, flags)
    if isinstance(value, str) and "@" in value:
        value = redact_url(value)  # a rejected --target-url may still carry a password
    shown = "" if value is None or isinstance(value, dict) or field in _UNQUOTED else f" {value!r}"
    if source.startswith("the default "):  # (a cross-field check can refuse a default beside another's value)
        return f"invalid value{shown} (the default) for {flag_name(pub)}: {msg}"
    return f"invalid value{shown} for {source}: {msg}"


def name_variables(message: str, args: argparse.Namespace) -> str:
    """``message`` with each flag it names that was not on the command line but came from its variable followed by
    that variable: checks past the settings (the planner's) name flags, and `KVWATCH_TENSOR_PARALLEL_SIZE=3` was
    reported as "--tensor-parallel-size", which the user never typed."""
    # An empty variable gave nothing (load_settings: unset, or refused naming the variable).
    environ = {upper for _, upper, value in _setting_variables() if value}
    for cls in (ServeSettings, CheckSettings):
        for field in cls.model_fields:
            pub = public_name(field)
            variable = env_name(pub)
            if getattr(args, field, None) is None and variable in environ and variable not in message:
                message = re.sub(rf"(?<![\w-]){re.escape(flag_name(pub))}(?![\w-])",
                                 lambda m, v=variable: f"{m[0]} (from {v})", message, count=1)
    return message


# Every KVWATCH_* variable any command understands; anything else is a typo and stops startup.
KNOWN_ENV: frozenset[str] = frozenset(env_name(public_name(f)) for cls in (ServeSettings, CheckSettings)
                                       for f in cls.model_fields)
