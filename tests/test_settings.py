"""Settings: flags and KVWATCH_* variables; bad values stop startup with exit 2 naming the source."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import certifi
import pytest

from kvwatch.cli import main
from kvwatch.settings import ServeSettings, SettingsError, add_settings_flags, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("KVWATCH_"):
            monkeypatch.delenv(key)


CA_BUNDLE = certifi.where()


def settings_from(argv: list[str]) -> ServeSettings:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, ServeSettings)
    return load_settings(ServeSettings, parser.parse_args(argv))


def test_defaults() -> None:
    s = settings_from([])
    assert (s.target_url, s.port, s.poll_interval_seconds) == ("http://127.0.0.1:8000/metrics", 9747, 5.0)
    assert (s.poll_timeout_seconds, s.stale_after_seconds, s.max_body_bytes) == (4.0, 15.0, 16 * 1024 * 1024)
    assert s.clock_speed == 1.0 and s.tls_verify is True


def test_flag_beats_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVWATCH_POLL_INTERVAL_SECONDS", "2")
    monkeypatch.setenv("KVWATCH_CLOCK_SPEED", "10")
    s = settings_from(["--poll-interval-seconds", "3"])
    assert (s.poll_interval_seconds, s.clock_speed, s.stale_after_seconds) == (3.0, 10.0, 9.0)


@pytest.mark.parametrize(("variable", "value", "flag", "given"), [
    ("KVWATCH_PORT", "abc", "--port", "18085"),
    ("KVWATCH_POLL_INTERVAL_SECONDS", "0", "--poll-interval-seconds", "1"),
])
def test_a_bad_variable_is_refused_though_its_flag_wins(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                                         flag: str, given: str) -> None:
    # the variable was never read when the flag was given, so its typo waited for the day the
    # flag is dropped from the manifest
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=f"invalid value '{value}' for {variable}: .*{flag} is given too"):
        settings_from([flag, given])
    monkeypatch.setenv(variable, "7")  # a good one beside the flag: the flag wins
    assert getattr(settings_from([flag, given]), "port" if flag == "--port" else "poll_interval_seconds") == float(
        given)


def test_override_selectors_accepted() -> None:
    s = settings_from(["--usage-metric", 'gpu_cache_usage_sys{kind="gpu"}', "--waiting-metric", "q"])
    assert s.usage_metric == 'gpu_cache_usage_sys{kind="gpu"}' and s.waiting_metric == "q"


@pytest.mark.parametrize(("argv", "named"), [
    (["--poll-interval-seconds", "0"], "--poll-interval-seconds"),
    (["--poll-interval-seconds", "2", "--poll-timeout-seconds", "2"], "--poll-timeout-seconds"),
    (["--port", "70000"], "--port"),
    (["--target-url", "vllm:8000"], "--target-url"),
    (["--usage-metric", "bad name{"], "--usage-metric"),
    (["--clock-speed", "0"], "--clock-speed"),
    (["--max-body-bytes", "ten"], "--max-body-bytes"),
    (["--log-level", "chatty"], "--log-level"),
    (["--bearer-token-file", "/nonexistent/token"], "--bearer-token-file"),
    (["--ca-file", __file__], "--ca-file"),  # exists, but is no CA bundle
    # Infinite or absurd values, which used to crash the scheduler (exit 1) or be accepted.
    (["--poll-interval-seconds", "inf"], "--poll-interval-seconds"),
    (["--poll-interval-seconds", "1e300"], "--poll-interval-seconds"),
    (["--poll-interval-seconds", "nan"], "--poll-interval-seconds"),
    (["--stale-after-seconds", "inf"], "--stale-after-seconds"),
    (["--clock-speed", "inf"], "--clock-speed"),
    (["--clock-speed", "1e9"], "--clock-speed"),
    (["--gpu-memory-gib", "inf"], "--gpu-memory-gib"),
    (["--poll-interval-seconds", "10", "--stale-after-seconds", "5"], "--stale-after-seconds"),
    (["--target-url", "http://x y/metrics"], "--target-url"),
    (["--target-url", "http://:8000/metrics"], "--target-url"),
    (["--target-url", "http://vllm:99999/metrics"], "--target-url"),
    (["--gpu", "H101"], "--gpu"),  # no such card: --gpu-memory-gib names one kvwatch has no preset for
    # a clock too slow to advance between polls; sums that overflow; not an address at all
    (["--clock-speed", "1e-9"], "--clock-speed"),
    (["--gpu-memory-gib", "1e300"], "--gpu-memory-gib"),
    (["--listen-address", "not a host"], "--listen-address"),
    (["--listen-address", ""], "--listen-address"),
    # read only with dcgm-exporter: accepted silently without it
    (["--gpu-pod", "vllm-0"], "--gpu-pod"),
    (["--gpu-namespace", "llm"], "--gpu-namespace"),
    (["--gpu-uuids", "GPU-1"], "--gpu-uuids"),  # with no GPU source: no GPU memory read, nothing said
    # the URL's basic auth replaced the bearer token's Authorization header
    (["--target-url", "http://u:p@vllm:8000/metrics", "--bearer-token-file", __file__], "--bearer-token-file"),
    # refused by the planner only at the first poll, as a warning; the memory guard switched off
    (["--block-size", "24"], "--block-size"),
    (["--block-size", "1000000000000000"], "--block-size"),
    (["--tensor-parallel-size", "1000000000"], "--tensor-parallel-size"),
    (["--pipeline-parallel-size", "1000000000"], "--pipeline-parallel-size"),
    (["--max-body-bytes", "1000000000000"], "--max-body-bytes"),
])
def test_bad_flag_exits_2_naming_it(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("variable", "value"), [
    ("KVWATCH_PORT", "-1"),
    ("KVWATCH_STALE_AFTER_SECONDS", "soon"),
    ("KVWATCH_TLS_VERIFY", "maybe"),
    ("KVWATCH_POLL_INTERVALL_SECONDS", "5"),  # a typo is refused, not ignored
    ("KVWATCH_LISTEN_ADDRESS", ""),  # bound 0.0.0.0 silently
    ("kvwatch_poll_intervall_seconds", "abc"),  # a lower-case typo was ignored (its upper-case twin refused)
])
def test_bad_variable_exits_2_naming_it(variable: str, value: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["serve"]) == 2
    assert variable in capsys.readouterr().err


def test_cross_field_message_names_where_each_value_came_from(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVWATCH_POLL_INTERVAL_SECONDS", "2")
    assert main(["serve", "--poll-timeout-seconds", "3"]) == 2
    err = capsys.readouterr().err
    assert "'3' for --poll-timeout-seconds" in err and "below KVWATCH_POLL_INTERVAL_SECONDS (2)" in err
    monkeypatch.setenv("KVWATCH_STALE_AFTER_SECONDS", "1")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "'1' for KVWATCH_STALE_AFTER_SECONDS" in err and "at least KVWATCH_POLL_INTERVAL_SECONDS (2)" in err
    monkeypatch.delenv("KVWATCH_POLL_INTERVAL_SECONDS")
    assert main(["serve", "--stale-after-seconds", "1"]) == 2
    assert "at least the default --poll-interval-seconds (5)" in capsys.readouterr().err


def test_stale_after_equal_to_the_interval_and_an_ipv6_url_are_fine() -> None:
    s = settings_from(["--poll-interval-seconds", "10", "--stale-after-seconds", "10",
                       "--target-url", "http://[::1]:8000/metrics"])
    assert s.stale_after_seconds == 10.0


def test_check_takes_the_same_override_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", "x.prom", "--usage-metric", "{"]) == 2
    assert "--usage-metric" in capsys.readouterr().err


def test_settings_error_is_a_value_error() -> None:
    with pytest.raises(SettingsError):
        settings_from(["--stale-after-seconds", "-3"])


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag, default in (("--port N", "9747"), ("--poll-interval-seconds X", "5"),
                          ("--max-body-bytes N", "16777216 = 16 MiB"), ("--tls-verify [BOOL]", "true"),
                          ("--target-url VALUE", "http://127.0.0.1:8000/metrics")):
        # The flag's own help (not the usage line): description, default, then its variable.
        own_help = re.escape(flag) + r" [^\[]*\(default: " + re.escape(default) + r"\) \[env KVWATCH_"
        assert re.search(own_help, text), flag


def test_a_password_in_the_target_url_never_reaches_a_message() -> None:
    with pytest.raises(SettingsError) as info:
        settings_from(["--target-url", "ftp://kv:hunter2@vllm:8000/metrics"])
    assert "hunter2" not in str(info.value) and "***@vllm:8000" in str(info.value)


def test_check_names_the_target_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["check", f"http://kv:hunter2@127.0.0.1:{port}/metrics", "--json"]) == 3
    out = capsys.readouterr()
    assert "hunter2" not in out.out + out.err and '"reason": "connect"' in out.out and "***@127.0.0.1" in out.out


def test_variables_are_read_case_insensitively_by_public_name_and_marked_as_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """load_settings reads KVWATCH_* itself (no pydantic_settings): any case, the public name, and a variable
    counts as given (model_fields_set), as a flag does; an empty KVWATCH_MODEL_CONFIG means none."""
    monkeypatch.setenv("kvwatch_port", "0")
    monkeypatch.setenv("KVWATCH_TLS_VERIFY", "false")
    monkeypatch.setenv("KVWATCH_MODEL_CONFIG", "")
    s = settings_from(["--target-url", "https://vllm:8000/metrics"])
    assert (s.port, s.tls_verify, s.model_config_path) == (0, False, None)
    assert {"port", "tls_verify"} <= s.model_fields_set and "model_config_path" not in s.model_fields_set
    assert "poll_interval_seconds" not in s.model_fields_set


@pytest.mark.parametrize(("flags", "said"), [
    (["--target-url", "https://vllm/metrics", "--ca-file", CA_BUNDLE, "--tls-verify", "false"],
     "--ca-file: cannot be used with --tls-verify false"),
    (["--ca-file", CA_BUNDLE], "--ca-file: applies to an https:// target only; the default --target-url is plain http"),
    (["--target-url", "http://vllm/metrics", "--tls-verify", "false"],
     "--tls-verify applies to an https:// target only; --target-url is plain http"),
])
def test_tls_flags_that_contradict_or_do_nothing_stop_startup(flags: list[str], said: str) -> None:
    # A CA bundle beside --tls-verify false, or either for a plain-http target, started without a word.
    with pytest.raises(SettingsError) as info:
        settings_from(flags)
    assert said in str(info.value)
    assert settings_from(["--target-url", "https://vllm/metrics", "--ca-file", CA_BUNDLE]).ca_file


def test_serve_loads_neither_pydantic_nor_a_scheduler_library() -> None:
    """pydantic (with what it imports) and APScheduler cost the sidecar ~12 MB of RSS (docs/performance.md):
    serve must not bring them back."""
    import subprocess
    import sys

    code = ("import sys, kvwatch.settings, kvwatch.serve.app\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('pydantic', 'pydantic_core', 'pydantic_settings', 'apscheduler')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_a_model_without_a_preset_does_not_stop_serve() -> None:
    # The chart passes the model vLLM serves to kvwatch too: a private fine-tune costs the capacity model
    # (logged), never the sidecar. check and plan, where --model is kvwatch's alone, refuse it (their tests).
    assert settings_from(["--model", "acme/private-finetune"]).model == "acme/private-finetune"


def test_ipv6_and_host_name_listen_addresses_are_accepted() -> None:
    for address in ("::", "::1", "0.0.0.0", "localhost", "kvwatch.svc.cluster.local"):
        assert ServeSettings(target_url="http://vllm:8000/metrics", listen_address=address).listen_address == address


def test_one_variable_in_two_spellings_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Names match whatever their case, so KVWATCH_POLL_INTERVAL_SECONDS=1 and kvwatch_poll_interval_seconds=2 were
    # one setting set twice, and one of them won silently.
    monkeypatch.setenv("KVWATCH_POLL_INTERVAL_SECONDS", "1")
    monkeypatch.setenv("kvwatch_poll_interval_seconds", "2")
    assert main(["serve"]) == 2
    assert "KVWATCH_POLL_INTERVAL_SECONDS is set twice" in capsys.readouterr().err


def test_kubernetes_service_links_of_a_service_named_kvwatch_are_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # `helm install kvwatch` names the Service kvwatch: every pod started after it gets these variables, and kvwatch
    # refused to start (KVWATCH_SERVICE_HOST unknown, KVWATCH_PORT=tcp://... no port number).
    for name, value in (("KVWATCH_SERVICE_HOST", "10.0.0.1"), ("KVWATCH_SERVICE_PORT", "9747"),
                        ("KVWATCH_SERVICE_PORT_METRICS", "9747"), ("KVWATCH_PORT", "tcp://10.0.0.1:9747"),
                        ("KVWATCH_PORT_9747_TCP", "tcp://10.0.0.1:9747"), ("KVWATCH_PORT_9747_TCP_PROTO", "tcp"),
                        ("KVWATCH_PORT_9747_TCP_PORT", "9747"), ("KVWATCH_PORT_9747_TCP_ADDR", "10.0.0.1")):
        monkeypatch.setenv(name, value)
    # (a release named kvwatch-llama: the Service kvwatch-llama)
    monkeypatch.setenv("KVWATCH_LLAMA_SERVICE_HOST", "10.0.0.2")
    monkeypatch.setenv("KVWATCH_LLAMA_PORT", "tcp://10.0.0.2:9747")
    monkeypatch.setenv("KVWATCH_LLAMA_PORT_9747_TCP_ADDR", "10.0.0.2")
    monkeypatch.setenv("KVWATCH_TARGET_URL", "http://127.0.0.1:8000/metrics")
    settings = load_settings(ServeSettings)
    assert settings.port == 9747  # the default: the link's KVWATCH_PORT is not a port setting
    monkeypatch.setenv("KVWATCH_PORT", "9999")
    assert load_settings(ServeSettings).port == 9999  # a real setting still is one
    monkeypatch.setenv("KVWATCH_PORT", " tcp://10.0.0.1:9747")  # (told by its stripped value, as settings read it)
    assert load_settings(ServeSettings).port == 9747


def test_a_typo_that_looks_like_no_service_link_is_still_refused(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVWATCH_POLL_PORT", "5")  # not a URL: no link, and no setting
    assert main(["serve"]) == 2
    assert "unknown variable KVWATCH_POLL_PORT" in capsys.readouterr().err



@pytest.mark.parametrize(("flag", "content", "said"), [
    ("--model-config", "not json", "is not valid JSON"),
    ("--model-config", "[1, 2]", "not an object"),
    ("--bearer-token-file", None, "the path is not a regular file"),
    ("--web-config-file", None, "is not a regular file"),
])
def test_files_that_cannot_be_what_the_flag_names_stop_startup(flag: str, content: str | None, said: str,
                                                               tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # a config.json that is no JSON was a warning at the first good poll, a device named "does
    # not exist", and a FIFO as --web-config-file hung the start silently, before SIGTERM was handled
    import os

    path = tmp_path / "file"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    assert main(["serve", "--target-url", "http://127.0.0.1:9/metrics", flag, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and said in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("where", ["port in use", "address not on this machine", "variable"])
def test_an_address_it_cannot_listen_on_stops_startup_naming_the_flags(where: str, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # bind failures were logged and exited 1 without naming a flag, or the variable the value came from
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        argv = ["serve", "--target-url", "http://127.0.0.1:9/metrics", "--port", str(taken.getsockname()[1])]
        if where == "port in use":
            argv += ["--listen-address", "127.0.0.1"]
        elif where == "address not on this machine":
            argv += ["--listen-address", "192.0.2.1"]  # TEST-NET-1 (RFC 5737): assigned to no host
        else:
            monkeypatch.setenv("KVWATCH_LISTEN_ADDRESS", "192.0.2.1")
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--listen-address" in err and "--port" in err
    assert ("(from KVWATCH_LISTEN_ADDRESS)" in err) == (where == "variable")


@pytest.mark.parametrize(("argv", "variables", "said"), [
    (["--poll-interval-seconds", "240"], {}, "invalid value '240' for --poll-interval-seconds"),
    (["--clock-speed", "100"], {}, "(the default) for --poll-interval-seconds: times --clock-speed (100) is 500 s"),
    (["--poll-interval-seconds", "5"], {"KVWATCH_CLOCK_SPEED": "30"}, "times KVWATCH_CLOCK_SPEED (30) is 150 s"),
])
def test_a_poll_step_the_forecaster_cannot_work_with_stops_startup(argv: list[str], variables: dict[str, str],
                                                                    said: str, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # polls 240 s apart (or 5 s at --clock-speed 100) left the forecaster warming_up for good, its
    # ETA +Inf with the cache full, and nothing said
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--target-url", "http://127.0.0.1:9/metrics", *argv]) == 2
    assert said in capsys.readouterr().err
    monkeypatch.delenv("KVWATCH_CLOCK_SPEED", raising=False)
    assert settings_from(["--poll-interval-seconds", "120"]).poll_interval_seconds == 120.0


def test_a_switch_refused_beside_another_setting_is_named_without_a_value(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `--nvml --dcgm-url ...` read "invalid value 'true' for --nvml", a value nobody typed.
    common = ["--dcgm-url", "http://dcgm:9400/metrics", "--gpu-pod", "p", "--target-url", "http://127.0.0.1:1/metrics"]
    assert main(["serve", "--nvml", *common]) == 2
    assert "kvwatch serve: --nvml cannot be used with --dcgm-url: pick one GPU source" in capsys.readouterr().err
    monkeypatch.setenv("KVWATCH_NVML", "true")  # a variable does have a value: quoted
    assert main(["serve", *common]) == 2
    assert "invalid value 'true' for KVWATCH_NVML: cannot be used with --dcgm-url" in capsys.readouterr().err


def test_a_target_on_port_0_is_refused_at_startup(capsys: pytest.CaptureFixture[str]) -> None:
    # It was accepted, and every poll failed with "connect": no server listens on port 0.
    assert main(["serve", "--target-url", "http://127.0.0.1:0/metrics"]) == 2
    assert "for --target-url: port 0 is no port a server listens on" in capsys.readouterr().err


def test_a_web_config_file_that_is_no_yaml_is_refused_in_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # YAML's own message spans five lines with a caret under the text; kvwatch's refusals are one.
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: [unclosed\n")
    assert main(["serve", "--target-url", "http://127.0.0.1:1/metrics", "--web-config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "but got '<stream end>' (line 3, column 1)" in err, err


def test_a_refused_log_level_is_quoted_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    # --log-level loud was refused as 'LOUD', a value the user never wrote.
    assert main(["serve", "--log-level", "loud"]) == 2
    err = capsys.readouterr().err
    assert "'loud'" in err and "LOUD" not in err and "DEBUG, INFO, WARNING, ERROR" in err
    assert settings_from(["--log-level", "warning"]).log_level == "WARNING"


def test_a_variable_for_a_command_option_says_options_have_none(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # KVWATCH_AVG_SEQ_LEN, after plan's --avg-seq-len: "no such setting" alone left the user to
    # guess why a flag has no variable.
    monkeypatch.setenv("KVWATCH_AVG_SEQ_LEN", "2000")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "KVWATCH_AVG_SEQ_LEN" in err and "--avg-seq-len is no setting" in err and "[env KVWATCH_" in err


@pytest.mark.parametrize("enterable", [True, False])
def test_a_bearer_token_file_that_cannot_be_read_stops_startup(tmp_path, enterable: bool) -> None:
    # a mode-000 token file started, then failed every poll; one in a folder this user may not
    # enter was a traceback. Root reads both, so as root the check runs as nobody (setpriv), as a pod's user would.
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(dir="/tmp")) if enterable else tmp_path  # (pytest's own are root's, mode 700)
    try:
        folder.chmod(0o755 if enterable else 0o700)
        token = folder / "token"
        token.write_text("secret\n")
        token.chmod(0)
        code = ("from kvwatch.cli import main; raise SystemExit(main(['check', 'http://127.0.0.1:1/metrics', "
                f"'--bearer-token-file', {str(token)!r}]))")
        as_root = os.geteuid() == 0
        prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"] if as_root else []
        if not as_root and not enterable:
            folder.chmod(0)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
        result = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                cwd="/", timeout=60)
    finally:
        folder.chmod(0o700)
        if enterable:
            shutil.rmtree(folder)
    assert result.returncode == 2, result.stderr
    assert "--bearer-token-file" in result.stderr and "Permission denied" in result.stderr


def test_a_token_given_for_its_files_path_is_not_quoted(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # KVWATCH_BEARER_TOKEN_FILE=<the token itself>: the refusal quoted it twice, into the pod's log
    monkeypatch.setenv("KVWATCH_BEARER_TOKEN_FILE", "eyJhbGciOiJSUzI1NiJ9.TOKENVALUE.sig")
    assert main(["check", "http://127.0.0.1:9/metrics"]) == 2
    err = capsys.readouterr().err
    assert "KVWATCH_BEARER_TOKEN_FILE" in err and "no such file" in err and "TOKENVALUE" not in err


def test_blanks_around_a_variable_are_no_part_of_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # " 2 " was read for a number, while " info " and " http://... " were refused
    monkeypatch.setenv("KVWATCH_LOG_LEVEL", " info ")
    monkeypatch.setenv("KVWATCH_TARGET_URL", " http://10.0.0.7:8000/metrics\n")
    monkeypatch.setenv("KVWATCH_LISTEN_ADDRESS", " 127.0.0.1 ")
    monkeypatch.setenv("KVWATCH_POLL_INTERVAL_SECONDS", " 2 ")
    s = settings_from([])
    assert (s.log_level, s.target_url, s.listen_address, s.poll_interval_seconds) == (
        "INFO", "http://10.0.0.7:8000/metrics", "127.0.0.1", 2.0)


def test_an_empty_variable_of_a_setting_that_may_be_unset_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # KVWATCH_MODEL= was taken as a model named "" (serve then asked for --model), KVWATCH_GPU= was refused
    for variable in ("KVWATCH_MODEL", "KVWATCH_GPU", "KVWATCH_QUANTIZATION", "KVWATCH_WEB_CONFIG_FILE"):
        monkeypatch.setenv(variable, " ")
    s = settings_from([])
    assert (s.model, s.gpu, s.quantization, s.web_config_file) == (None, None, None, None)
    # One with a default is refused: a broken template's KVWATCH_TARGET_URL= must not poll the default target
    monkeypatch.setenv("KVWATCH_TARGET_URL", "")
    with pytest.raises(SettingsError, match="KVWATCH_TARGET_URL"):
        settings_from([])


@pytest.mark.parametrize("flag", ["--model", "--gpu", "--quantization", "--web-config-file", "--model-config",
                                  "--target-url"])
def test_a_flag_typed_empty_is_refused_naming_it(flag: str) -> None:
    # --model '' was taken as a model named "" (serve started); an empty path read as "." ("--web-config-file: . is
    # not a regular file")
    with pytest.raises(SettingsError, match=f"^invalid value '' for {flag}: Input should not be empty$"):
        settings_from([flag, ""])


@pytest.mark.parametrize("argv", [["backtest", "--trace", ""], ["check", "--file", ""], ["plan", "--plot", " "]])
def test_an_empty_path_flag_is_refused_not_read_as_the_current_directory(argv: list[str],
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # "--trace ''" was reported as "--trace .: a directory, not a trace file"
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"argument {argv[1]}: should not be empty" in capsys.readouterr().err
