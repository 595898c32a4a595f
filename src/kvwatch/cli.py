"""The ``kvwatch`` command: a thin dispatcher to one module per subcommand.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Only the chosen
command's module is imported, so ``kvwatch plan`` never pays for the HTTP stack and one command's
import error cannot break another; ``kvwatch --help`` imports neither the settings layer nor
``importlib.metadata`` (the version is a constant of the package, ``kvwatch.__version__``). Exit codes: 0 ok,
2 bad usage or config, 1 runtime failure (``check``: 1 for ``--fail-on``'s findings, 3 for a payload it cannot
read).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kvwatch.serve.app", "run the sidecar: poll vLLM, forecast, serve kvwatch_* metrics"),
    "check": ("kvwatch.check", "one poll of an engine's /metrics (vLLM, SGLang, TensorRT-LLM) or a saved payload, "
              "then a diagnosis"),
    "plan": ("kvwatch.plan", "KV capacity sums and what-if scenarios for a model on a GPU"),
    "simulate": ("kvwatch.sim.cli", "the built-in vLLM simulator serving /metrics"),
    "demo": ("kvwatch.demo", "simulator + sidecar together, filling the KV cache in minutes"),
    "backtest": ("kvwatch.backtest.cli", "score the exhaustion forecast against baselines on traces"),
}


EXIT_BROKEN_PIPE = 128 + 13  # what the shell reports for a process killed by SIGPIPE
# kvwatch's own bug meeting this input: not 1, which check's --fail-on and plan's "will not start" mean (an overflow
# on a 1e308 capacity label exited 1 with a traceback: a CI job on --fail-on critical read a critical finding)
EXIT_INTERNAL = 4


class _Version(argparse.Action):
    """argparse's ``version`` action, with the version looked up only when the flag is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import kvwatch

        parser._print_message(f"kvwatch {kvwatch.__version__}\n", sys.stdout)
        parser.exit()


def usage_error_json(message: str) -> str:
    """Bad usage as one JSON object, for a command given ``--json`` (a script reads one format)."""
    return json.dumps({"error": {"reason": "usage", "message": message}})


class Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the command (``kvwatch serve: ...``), not the usage block; with
    ``json_errors`` (a command given ``--json`` whose module sets ``JSON_USAGE_ERRORS``) also as JSON on stdout."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        self.usage_exit(self.prog, message)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python < 3.12 drops the "--" of `--file=--` and hands the option [] unconverted (a traceback later)
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return super()._get_values(action, arg_strings)

    def usage_exit(self, prog: str, message: str) -> NoReturn:
        if "://" in message:  # (a stray or misspelt argument was echoed whole: a URL's password with it)
            import re

            from kvwatch.settings import redact_url

            message = re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", lambda m: redact_url(m.group()), message)
        if self.json_errors:
            print(usage_error_json(message), flush=True)
        self.exit(2, f"{prog}: {message} (see {prog} --help)\n")


def _json_errors(command: str | None, argv: Sequence[str]) -> bool:
    """Whether this command line wants its usage errors as JSON too (its module opts in, and --json is given)."""
    if command is None or "--json" not in argv:
        return False
    return bool(getattr(importlib.import_module(COMMANDS[command][0]), "JSON_USAGE_ERRORS", False))


def build_parser(command: str | None = None, *, json_errors: bool = False) -> Parser:
    # No abbreviated flags (argparse's default takes --por for --port): a typo is refused, as a misspelt KVWATCH_*
    # variable is, and a new flag can never make an old command line ambiguous.
    parser = Parser(
        prog="kvwatch",
        description="KV-cache watchdog for vLLM: exporter, exhaustion forecaster and alerting sidecar.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        if name == command:
            importlib.import_module(module).add_arguments(p)
            parser.json_errors = p.json_errors = json_errors
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    json_errors = _json_errors(command, argv)
    parser = build_parser(command, json_errors=json_errors)
    # Unknown flags end up with the top-level parser, which would blame "kvwatch": name the subcommand.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        prog = f"kvwatch {args.command}" if args.command else "kvwatch"
        noun = "argument" if len(unknown) == 1 else "arguments"
        parser.usage_exit(prog, f"unrecognized {noun}: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe must fail here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        # Whatever is still buffered would fail again at exit: send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A bad setting: kvwatch.settings is imported only by the commands that have settings, so a command
        # that never imported it cannot raise its SettingsError.
        settings = sys.modules.get("kvwatch.settings")
        if settings is None or not isinstance(exc, settings.SettingsError):
            import traceback  # (only here: it costs every start 0.6 MB of RSS and 3 ms, kvwatch --help included)

            traceback.print_exc()
            if json_errors:
                print(json.dumps({"error": {"reason": "internal",
                                            "message": f"kvwatch failed: {type(exc).__name__}: {exc}"}}))
            print(f"kvwatch {args.command}: kvwatch failed on this input ({type(exc).__name__}: {exc}); "
                  "please report it with the traceback above", file=sys.stderr)
            return EXIT_INTERNAL
        message = str(exc) if exc.sources_named else settings.name_variables(str(exc), args)
        if json_errors:
            print(usage_error_json(message))
        print(f"kvwatch {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
