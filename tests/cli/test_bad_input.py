"""Bad configuration and request files: a clear `error:` on stderr, exit status 2, no traceback."""

from __future__ import annotations

import hashlib
import io
import os
import signal
from pathlib import Path

import pytest

from router.cli import main
from tests.support.gateway_python import gateway_python
from tests.support.processes import run_in_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()
GOOD_CONFIG = """
models:
  - name: m
    tokenizer: /nonexistent/tokenizer.json
    latency:
      prefill: [http://127.0.0.1:9]
      nodes: [{host: 127.0.0.1, ctrl_port: 9, http_port: 9}]
"""
# What `serve` would start with (classify, like serve, loads the model's tokenizer).
SERVABLE_CONFIG = GOOD_CONFIG.replace("/nonexistent/tokenizer.json", "deepseek")
GOOD_REQUEST = '{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

CONFIG_CASES = [
    ("missing", None, "cannot read"),
    ("not yaml", "models: [\n", "router.yaml: line 2, column 1: not valid YAML: expected"),
    ("not a mapping", "- 1\n", "the top level must be a mapping"),
    ("unknown field", GOOD_CONFIG + "colour: blue\n", "colour: Extra inputs are not permitted"),
    (
        "bad port",
        GOOD_CONFIG.replace("ctrl_port: 9", "ctrl_port: 0"),
        "models[0] (m).latency.nodes[0].ctrl_port: ",
    ),
    (
        "bad rule",
        GOOD_CONFIG + "classification: {rules: [{name: r, path: sideways}]}\n",
        "rule 'r': path",
    ),
    (
        "node in two models",
        GOOD_CONFIG + GOOD_CONFIG.split("\n", 2)[2].replace("name: m", "name: m2"),
        "node in the latency pools of two models: ['127.0.0.1:9']",
    ),
    (
        "several workers on the memory gate",
        GOOD_CONFIG + "server: {workers: 2}\n",
        "server.workers is 2, but gate.backend memory keeps the TileRT pool in one process",
    ),
    (
        "node of another release than its pool",
        GOOD_CONFIG.replace("http_port: 9}", "http_port: 9, tilert: '0.1.5'}"),
        "node 127.0.0.1:9 says TileRT 0.1.5 in a pool of TileRT 0.1.6",
    ),
    (
        "empty admin key",
        GOOD_CONFIG + 'admin: {api_key: ""}\n',
        "admin.api_key: Value error, an empty key would let anyone in",
    ),
    (
        "admin key of blanks",
        GOOD_CONFIG + "admin: {api_key: '  '}\n",
        "an empty key would let anyone in",
    ),
    (
        "client key digest of the empty key",
        GOOD_CONFIG + f"auth: {{api_keys: [{{name: k, sha256: {EMPTY_DIGEST}}}]}}\n",
        "key 'k': sha256 is the digest of an empty key",
    ),
    (
        "client key from an environment variable without a name",
        GOOD_CONFIG + "auth: {api_keys: [{name: k, key_env: ''}]}\n",
        "key_env",
    ),
    (
        "missing rules file",
        GOOD_CONFIG + "classification: {rules_file: nowhere.yaml}\n",
        "nowhere.yaml",
    ),
    (
        "two fields at fault",
        GOOD_CONFIG + "server: {port: 99999, colour: blue}\n",
        ": server.port: Input should be less than or equal to 65535 (got 99999);"
        " server.colour: Extra inputs are not permitted (got 'blue')",
    ),
    (
        "two rules at fault",
        GOOD_CONFIG
        + "classification: {rules: {rules: [{name: r, path: up}, {name: q, path: down}]}}\n",
        ": classification: classification.rules: rule 'r': path: Input should be 'latency' or"
        " 'throughput'; classification.rules: rule 'q': path: ",
    ),
]

REQUEST_CASES = [
    ("missing", None, "cannot read"),
    ("not json", "{model: m}", "not valid JSON"),
    ("not an object", "[1, 2]", "JSON object"),
    ("no messages", '{"model": "m"}', "not a valid chat request (messages)"),
    ("wrong type", '{"model": "m", "messages": "hi"}', "(messages)"),
    ("fractional budget", GOOD_REQUEST[:-1] + ', "max_tokens": 5.5}', "(max_tokens)"),
    ("budget as a word", GOOD_REQUEST[:-1] + ', "max_tokens": "five"}', "(max_tokens)"),
    ("role not text", '{"model": "m", "messages": [{"role": 1}]}', "(messages.0.role)"),
    ("unknown model", GOOD_REQUEST.replace('"m"', '"other"'), "unknown model 'other' (known: m)"),
]


def write(tmp_path: Path, name: str, text: str | None) -> Path:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("case", "text", "message"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
@pytest.mark.parametrize("command", ["check", "classify", "demo"])
def test_bad_config(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    case: str,
    text: str | None,
    message: str,
) -> None:
    config = write(tmp_path, "router.yaml", text)
    argv = [command, "--config", str(config)]
    if command == "classify":
        argv += ["--request", str(write(tmp_path, "body.json", GOOD_REQUEST))]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ")
    assert captured.err.count("\n") == 1, "one line, whatever the problems"
    assert message in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("case", "text", "message"), REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES]
)
def test_bad_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, text: str | None, message: str
) -> None:
    config = write(tmp_path, "router.yaml", SERVABLE_CONFIG)
    request = write(tmp_path, "body.json", text)
    assert main(["classify", "--config", str(config), "--request", str(request)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {request}: ")
    assert message in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_request_over_max_body_bytes_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    config = write(tmp_path, "router.yaml", SERVABLE_CONFIG + "server: {max_body_bytes: 1024}\n")
    text = GOOD_REQUEST.replace('"hi"', '"' + "hi " * 5000 + '"')
    stream = io.BytesIO(text.encode())
    if source == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stream))
        request, name = "-", "stdin"
    else:
        request = name = str(write(tmp_path, "body.json", text))
    assert main(["classify", "--config", str(config), "--request", request]) == 2
    assert capsys.readouterr().err == (
        f"error: {name}: the request body exceeds 1024 bytes; at most 1024 bytes are accepted"
        " (server.max_body_bytes)\n"
    )
    if source == "stdin":
        assert stream.tell() == 1025  # read no further than needed to refuse it


def test_an_empty_admin_key_from_the_environment_does_not_remove_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path, "router.yaml", GOOD_CONFIG + "admin: {api_key: s3cret}\n")
    monkeypatch.setenv("PDGW_ADMIN__API_KEY", "")
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "error: PDGW_ADMIN__API_KEY: empty, and an empty key is never a key (unset the"
        " variable to keep the file's)\n"
    )


def test_values_are_classified_as_vllm_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Numbers and booleans sent as text are what the rules see, converted."""
    config = write(tmp_path, "router.yaml", SERVABLE_CONFIG)
    text = GOOD_REQUEST[:-1] + ', "stream": "true", "max_tokens": "5.0"}'
    request = write(tmp_path, "body.json", text.replace('"user"', '"critic"'))
    assert main(["classify", "--config", str(config), "--request", str(request)]) == 0
    out = capsys.readouterr().out
    assert "request: model 'm', chat, stream," in out
    assert "max_tokens 5\n" in out


@pytest.mark.parametrize(
    ("command", "default"),
    [
        ("serve", "router.yaml in the current folder"),
        ("check", "router.yaml in the current folder"),
        ("classify", "router.yaml in the current folder"),
        ("demo", "the bundled router.yaml"),
    ],
)
def test_the_config_flag_says_its_default_and_the_environments_part(
    capsys: pytest.CaptureFixture[str], command: str, default: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        f"--config FILE the configuration file (default: {default}); PDGW_* environment"
        " variables override its settings, e.g. PDGW_SERVER__PORT=9000 for server.port"
        " (docs/configuration.md)"
    ) in text


def test_bad_header_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "router.yaml", GOOD_CONFIG)
    request = write(tmp_path, "body.json", GOOD_REQUEST)
    with pytest.raises(SystemExit) as exited:
        main(["classify", "--config", str(config), "--request", str(request), "--header", "x"])
    assert exited.value.code == 2
    assert "expected NAME=VALUE, got 'x'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "where"),
    [("10.0.0.5", "model m"), ("tilert-0.tilert.svc", "model m")],
)
def test_demo_refuses_remote_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], host: str, where: str
) -> None:
    config = write(tmp_path, "router.yaml", GOOD_CONFIG.replace("host: 127.0.0.1", f"host: {host}"))
    assert main(["demo", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {where}: {host!r} is not a loopback address")


@pytest.mark.e2e  # runs the CLI as a process
def test_no_traceback_from_the_real_command(tmp_path: Path) -> None:
    request = write(tmp_path, "body.json", "{")
    config = write(tmp_path, "router.yaml", GOOD_CONFIG)
    argv = ["classify", "--config", str(config), "--request", str(request)]
    result = run_in_group(
        [gateway_python(), "-m", "router.cli", *argv], cwd=PROJECT_ROOT, timeout_s=60
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_check_accepts_the_default_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(PROJECT_ROOT / "router.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.endswith(": ok (2 model(s); keys, tokenizers and templates read)\n")


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_missing_tokenizer_names_its_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    config = write(tmp_path, "gateway.yaml", GOOD_CONFIG)
    assert main([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {config}: models[0] (m).tokenizer: "
        "no tokenizer.json at /nonexistent/tokenizer.json\n"
    )


def test_errors_name_the_file_given_and_suggest_the_closest_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, "prod.yaml", GOOD_CONFIG + "timeout: {connect_s: 1}\n")
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {config}: timeout: Extra inputs are not permitted (did you mean 'timeouts'?)\n"
    )


@pytest.mark.parametrize(
    ("node", "hint"),
    [
        ("{host: h, ctrl_port: 9, http_prot: 9}", " (did you mean 'http_port'?)"),
        ("{host: h, ctrl_port: 9, timeouts: 9}", ""),  # a field of another section only
    ],
)
def test_a_suggestion_is_a_field_of_the_section_the_misspelt_name_is_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node: str, hint: str
) -> None:
    nodes = "nodes: [{host: 127.0.0.1, ctrl_port: 9, http_port: 9}]"
    config = write(tmp_path, "prod.yaml", GOOD_CONFIG.replace(nodes, f"nodes: [{node}]"))
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    wrong = node.split(", ")[-1].split(":")[0]
    assert f"models[0] (m).latency.nodes[0].{wrong}: Extra inputs are not permitted (got 9)" in err
    assert err.endswith(f"(got 9){hint}\n") or f"(got 9){hint};" in err


def test_a_yaml_syntax_error_is_one_line_naming_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, "prod.yaml", GOOD_CONFIG.replace("    latency:", "   latency: :"))
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"error: {config}: line 5, column 4: not valid YAML: "
        "expected <block end>, but found '<block mapping start>'\n"
    )


def test_fields_are_named_as_the_file_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = SERVABLE_CONFIG.replace("name: m", "name: ds").replace(
        "nodes: [{host: 127.0.0.1, ctrl_port: 9, http_port: 9}]",
        "nodes: [{host: 127.0.0.1, ctrl_port: 9, http_port: 9}, {host: h, ctrl_port: 0}]",
    )
    assert main(["check", "--config", str(write(tmp_path, "router.yaml", text))]) == 2
    err = capsys.readouterr().err
    assert ": models[0] (ds).latency.nodes[1].ctrl_port: " in err
    assert "models.0" not in err


KEY_FILE_CONFIG = SERVABLE_CONFIG + "auth: {api_keys: [{name: team, key_file: missing-key}]}\n"


@pytest.mark.parametrize("command", ["check", "serve"])
def test_check_refuses_what_serve_refuses_in_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    config = write(tmp_path, "router.yaml", KEY_FILE_CONFIG)
    assert main([command, "--config", str(config), *(["--port", "0"] * (command == "serve"))]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"error: {config}: auth.api_keys[0] (team): cannot read {tmp_path / 'missing-key'}: "
        "No such file or directory\n"
    )
    assert captured.out == ""


def test_check_refuses_the_kustomize_base_without_its_secrets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The base's key files are mounted from Secrets, absent here: `serve` could not start."""
    config = PROJECT_ROOT / "deploy" / "kustomize" / "base" / "router.yaml"
    assert main(["check", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"error: {config}: auth.api_keys[0] (default): cannot read "
        "/run/secrets/pd-gateway/client-key: No such file or directory\n"
    )


def test_serve_on_a_taken_port_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = PROJECT_ROOT / "router.yaml"
        assert main(["serve", "--config", str(config), "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--log-level", "loud"], "invalid choice: 'loud'"),
        (["serve", "--port", "70000"], "not a port number"),
        (["serve", "--port", "http"], "not a port number"),
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("pd-gateway ")


@pytest.mark.e2e  # runs the CLI as a process
@pytest.mark.parametrize("command", ["schema", "check", "classify"])
def test_a_reader_that_leaves_early_ends_no_command_in_a_traceback(
    tmp_path: Path, command: str
) -> None:
    """As `pd-gateway ... | head -1`: the pipe's read end is closed before the output comes."""
    argv = [command]
    if command != "schema":
        argv += ["--config", str(write(tmp_path, "router.yaml", SERVABLE_CONFIG))]
    if command == "classify":
        argv += ["--request", str(write(tmp_path, "body.json", GOOD_REQUEST))]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = run_in_group(
            [gateway_python(), "-m", "router.cli", *argv],
            stdout=write_end,
            cwd=PROJECT_ROOT,
            timeout_s=120,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 128 + signal.SIGPIPE
