"""The kvwatch dispatcher: usage errors are one line naming the subcommand (exit 2); a closed pipe is quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import kvwatch
from kvwatch.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom"


@pytest.mark.parametrize(("argv", "words"), [
    (["serve", "--bad-flag"], ["kvwatch serve", "--bad-flag"]),
    (["check", "--file", str(FIXTURE), "--nope", "--json", "-x"], ["kvwatch check", "arguments: --nope -x"]),
    (["serve", "--port"], ["kvwatch serve", "--port", "expected one argument"]),
    (["bogus"], ["kvwatch", "bogus"]),
    # `--file=--`: Python < 3.12's argparse handed the option [] (a traceback in check, plan and backtest)
    (["check", "--file=--"], ["kvwatch check", "--file", "expected one argument"]),
    (["plan", "--model", "x", "--plot=--"], ["kvwatch plan", "--plot", "expected one argument"]),
    (["backtest", "--trace=--"], ["kvwatch backtest", "--trace", "expected one argument"]),
    # an abbreviated flag was taken for the one it begins (serve --por 0 listened on a free port)
    (["check", "--fil", str(FIXTURE)], ["kvwatch check", "unrecognized argument: --fil"]),
    (["plan", "--model", "x", "--max-model", "8192"], ["kvwatch plan", "--max-model"]),
])
def test_usage_errors_are_one_line_naming_the_command(argv: list[str], words: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    assert all(w in err for w in words), err


def test_output_into_a_closed_pipe_exits_quietly() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    proc = subprocess.Popen([sys.executable, "-m", "kvwatch", "check", "--file", str(FIXTURE), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head` that has gone before kvwatch writes a byte
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_top_level_help_imports_no_settings_layer_and_version_is_lazy() -> None:
    """``kvwatch --help`` loads neither pydantic (the settings layer) nor importlib.metadata; --version
    still prints the installed version."""
    code = ("import sys, contextlib, io\nfrom kvwatch import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): cli.main(['--help'])\n"
            "print(sorted(m for m in ('kvwatch.settings', 'pydantic', 'pydantic_settings', 'importlib.metadata')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
    version_out = subprocess.run([sys.executable, "-m", "kvwatch", "--version"], check=True, capture_output=True,
                                 text=True).stdout
    assert version_out == f"kvwatch {version('kvwatch')}\n" == f"kvwatch {kvwatch.__version__}\n"


def test_kvwatchs_own_failure_exits_4_not_1_and_says_so_in_json(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # (Standing in for a bug no test knows yet.) An OverflowError on a 1e308 capacity label exited 1 with a traceback:
    # 1 is check's "a finding at or above --fail-on" and plan's "vLLM will not start", and --json printed nothing.
    import json

    from kvwatch import check

    def broken(*args: object, **kwargs: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(check, "build_report", broken)
    page = Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom"
    assert main(["check", "--file", str(page), "--json", "--fail-on", "critical"]) == 4
    out, err = capsys.readouterr()
    assert json.loads(out)["error"]["reason"] == "internal"
    assert "Traceback" in err and "kvwatch check: kvwatch failed on this input (OverflowError" in err


def test_a_1e308_capacity_label_or_a_length_beyond_any_model_is_no_overflow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    page = Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom"
    huge = tmp_path / "huge.prom"
    huge.write_text(__import__("re").sub(r'kv_cache_size_tokens="\d+"', 'kv_cache_size_tokens="1e308"',
                                         page.read_text()))
    assert huge.read_text() != page.read_text()
    code = main(["check", "--file", str(huge), "--json", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu",
                 "H100"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    # ignored, as implausible_values says, not the capacity all the same (the formula's now)
    assert "implausible_values" in {f["id"] for f in report["findings"]}
    assert all(s["kv_capacity_tokens"] < 1e7 for s in report["series"]), report["series"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
                                  "vocab_size": 128256, "max_position_embeddings": 131072,
                                  "rope_scaling": {"rope_type": "linear", "factor": 1e300}}))
    assert main(["plan", "--model-config", str(config), "--gpu", "H100"]) == 2
    assert "more than any model holds" in capsys.readouterr().err
